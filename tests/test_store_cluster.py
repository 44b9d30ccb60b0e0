"""The Redis store on a Redis Cluster (`store.url: redis+cluster://...`, design.md 9.9): real
processes, three primaries and their replicas, made by `redis-cli --cluster create`. Every store
test of every file that takes the `store` fixture runs here too (conftest.py's "cluster" form);
these are what a cluster adds: a chain on one slot, a chain across slots walked on, a slot
migrated while turns write to it (MOVED, ASK), a primary killed during a background run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import redis
from redis.crc import key_slot

from proxy.config import ConfigError, parse
from proxy.responses.lifecycle import CHAIN_TAG
from proxy.store.backend import StoredResponse
from proxy.store.redis import RedisBackend
from tests.client import envelope, parse_sse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.redis_server import Cluster, RedisServer, cluster_binary, command_calls, until
from tests.test_store import create, get, proxy_config, text_turn

pytestmark = pytest.mark.skipif(
    cluster_binary() is None, reason="no redis-server 7 or later with redis-cli, to run a cluster: apt-get install redis-server"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of this test's own, for one whose faults would spoil the session's."""
    with Cluster(tmp_path) as made:
        yield made


def prefix() -> str:
    return f"test-{time.time_ns()}:"


async def test_a_chain_lives_on_one_slot_and_is_read_in_one_script(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, redis_cluster: Cluster
) -> None:
    """A chain's responses share their ids' tag, so its records share a slot, and a turn at
    depth 10 reads its chain in one script and keeps itself in two more (its owner's, then its
    record), as at depth 3."""
    store = {"url": redis_cluster.url, "prefix": prefix()}
    url = await start_proxy(proxy_config(upstream, store))
    upstream.script(Reply(text_turn("ok")))
    ids: list[str] = []
    scripts = []
    for i in range(10):
        before = command_calls(redis_cluster.url)["evalsha"]
        body = {"model": "m", "input": f"turn {i}", **({"previous_response_id": ids[-1]} if ids else {})}
        ids.append((await create(http, url, body, stream=False))["id"])
        scripts.append(command_calls(redis_cluster.url)["evalsha"] - before)
    assert {id[:CHAIN_TAG] for id in ids} == {ids[0][:CHAIN_TAG]}
    # The records as the nodes hold them: ten keys, one slot.
    records = []
    for node in redis_cluster.primaries().values():
        with node.client() as client:
            records += client.scan_iter(f"{store['prefix']}response:*")
    assert len(records) == 10 and len({key_slot(key) for key in records}) == 1
    # Past the first two turns, which also load the scripts on their nodes: one to read the chain,
    # one to add the response to its owner's, one to write its record, however deep.
    assert scripts[2:] == [3] * 8
    said = [m["content"] for m in upstream.requests[-1]["messages"]]
    assert said == [text for i in range(10) for text in (f"turn {i}", "ok")][:-1]


def linked(id: str, previous: str | None) -> StoredResponse:
    response = msgspec.Raw(b'{"id":"%s","status":"completed","output":[]}' % id.encode())
    return StoredResponse(
        id=id, owner="owner", previous=previous, created_at=int(time.time()), response=response, input_items=msgspec.Raw(b"[]")
    )


async def test_a_chain_across_slots_is_walked_on_from_each(redis_cluster: Cluster) -> None:
    """A chain whose ids changed their tag (none the proxy makes now, but any a store may hold) is
    read whole, one script a slot; a missing link on another slot is named where the walk stopped."""
    backend = RedisBackend("", prefix(), 60, 100, 2.0, 8, cluster=parse_cluster(redis_cluster.url))
    try:
        ids = ["resp_aaaaaaaa01", "resp_aaaaaaaa02", "resp_bbbbbbbb03", "resp_cccccccc04", "resp_cccccccc05"]
        slots = {key_slot(f"x{{{id[:CHAIN_TAG]}}}".encode()) for id in ids}
        assert len(slots) == 3
        for previous, id in zip([None, *ids], ids, strict=False):
            await backend.put(linked(id, previous), True, None)
        chain, stopped = await backend.chain(ids[-1], "owner")
        assert [stored.id for stored in chain] == ids and stopped is None
        await backend.delete(ids[1], "owner")
        chain, stopped = await backend.chain(ids[-1], "owner")
        assert [stored.id for stored in chain] == ids[2:] and stopped == ids[1]
        assert await backend.chain(ids[-1], "another") == ([], ids[-1])
    finally:
        await backend.close()


def parse_cluster(url: str) -> Any:
    return parse({"upstreams": [{"name": "d", "urls": ["http://127.0.0.1:9"]}], "store": {"url": url}}).store.cluster


@pytest.mark.parametrize(
    "url", ["redis+cluster://", "redis+cluster://h:port", "redis+cluster://h:1/2", "rediss+cluster://,h:1"]
)
def test_a_cluster_url_without_nodes_or_with_a_database_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^store\.url: "):
        parse({"upstreams": [{"name": "default", "urls": ["http://127.0.0.1:1"]}], "store": {"url": url}})


def test_a_cluster_url_names_its_nodes_and_credentials() -> None:
    assert parse_cluster("rediss+cluster://u:p%40ss@a:7000,[::1],b") == ([("a", 7000), ("::1", 6379), ("b", 6379)], "u", "p@ss", True)
    with pytest.raises(ConfigError, match=r"^store\.prefix: "):
        parse({"upstreams": [{"name": "d", "urls": ["http://127.0.0.1:1"]}], "store": {"url": "redis+cluster://a", "prefix": "{x}"}})


async def test_a_full_pool_is_waited_for(redis_cluster: Cluster) -> None:
    """As on one server (9.8): calls past `max_connections` wait for one, none fails for want of
    one (redis-py's cluster client alone raises `MaxConnectionsError`)."""
    backend = RedisBackend("", prefix(), 60, 100, 2.0, 1, cluster=parse_cluster(redis_cluster.url))
    try:
        # Each read holds its node's one connection for its 0.05 s wait on an empty stream.
        answers = await asyncio.gather(*(backend.read(f"resp_{n:08}", 0, 0.05) for n in range(4)))
        assert answers == [[]] * 4
    finally:
        await backend.close()


def migrate(cluster: Cluster, key: str, done: threading.Event) -> None:
    """Move `key`'s slot to another primary as `redis-cli --cluster reshard` does, a few keys at
    a time while the slot is open on both (ASK), then give it to the new one (MOVED)."""
    src, dst, number = cluster.begin_migration(key)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", number, 2):
        cluster.move(src, dst, *keys)
        time.sleep(0.02)  # turns write meanwhile, some of their keys moved and some not
    cluster.finish_migration(src, dst, number)
    done.set()


async def test_a_slot_migrated_while_a_chain_writes_to_it(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, cluster: Cluster
) -> None:
    """The slot of a chain moves to another primary while turns extend the chain: every turn is
    answered and kept (the client follows ASK and MOVED; a script that met a key moved away runs
    again), and the chain is read whole from its new node."""
    store = {"url": cluster.url, "prefix": prefix()}
    url = await start_proxy(proxy_config(upstream, store))
    upstream.script(Reply(text_turn("ok")))
    ids = [(await create(http, url, {"model": "m", "input": "turn 0"}, stream=False))["id"]]
    for i in range(1, 20):  # keys enough in the slot for a migration that takes a while
        ids.append((await create(http, url, {"model": "m", "input": f"turn {i}", "previous_response_id": ids[-1]}, stream=False))["id"])
    record = f"{store['prefix']}response:{{{ids[0][:CHAIN_TAG]}}}{ids[0]}"
    before = cluster.node_of(record)
    done = threading.Event()
    mover = threading.Thread(target=migrate, args=(cluster, record, done))
    mover.start()
    try:
        while not done.is_set():
            body = {"model": "m", "input": f"turn {len(ids)}", "previous_response_id": ids[-1]}
            ids.append((await create(http, url, body, stream=False))["id"])
    finally:
        mover.join()
    assert cluster.node_of(record) is not before and len(ids) > 21
    body = {"model": "m", "input": "last", "previous_response_id": ids[-1]}
    await create(http, url, body, stream=True)
    said = [m["content"] for m in upstream.requests[-1]["messages"]]
    assert said == [text for i in range(len(ids)) for text in (f"turn {i}", "ok")] + ["last"]
    for id in ids:
        status, _ = await get(http, url, id)
        assert status == 200


async def a_run_through_a_failover(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, url: str, kill: Callable[[str], float]
) -> None:
    """A background run on one proxy, read from another, while `kill` (given the run's id, and
    answering how long the switch took) kills the store's primary that keeps the run: every
    read meanwhile is answered or a 503 `store_unavailable` within the store's time; the run
    ends completed, its Response and every event kept, each once, in order (none lost, none
    half-written)."""
    timeout = 1.0
    config = proxy_config(upstream, {"url": url, "prefix": prefix(), "timeout": timeout})
    runner, reader = await start_proxy(config), await start_proxy(config)
    words = [f"w{n} " for n in range(80)]
    steps = [*(Step("text", word) for word in words), Step("finish", finish_reason="stop")]
    upstream.script(Reply(Generation(steps), delay=0.05))
    queued = await create(http, runner, {"model": "m", "input": "hi", "background": True}, stream=False)
    await asyncio.sleep(1.0)  # a fifth of its events kept
    status, body = await get(http, reader, queued["id"])
    assert status == 200 and body["status"] == "in_progress" and body["output"], body
    switch = await asyncio.to_thread(kill, queued["id"])
    assert switch < 15, f"no primary again within 15 s ({switch:.1f} s)"
    while True:
        started = time.monotonic()
        status, body = await get(http, reader, queued["id"])
        assert time.monotonic() - started < 2.5 * timeout
        assert status == 200 or (status == 503 and envelope(body, "store_unavailable")), body
        if status == 200 and body["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.1)
    assert body["status"] == "completed" and body["output"][0]["content"][0]["text"] == "".join(words)
    async with http.get(f"{reader}/v1/responses/{queued['id']}?stream=true&starting_after=-1") as replay:
        events = [event for event in parse_sse(await replay.read()) if event != "[DONE]"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta") == "".join(words)
    assert events[-1]["type"] == "response.completed"


def caught_up(primary: RedisServer, replica: RedisServer) -> bool:
    """Whether the replica holds every write its primary acknowledged (INFO replication)."""
    with redis.Redis(port=primary.port) as source, redis.Redis(port=replica.port) as copy:
        written = source.info("replication")["master_repl_offset"]
        held = copy.info("replication")
    return bool(held.get("master_link_status") == "up" and held["slave_repl_offset"] >= written)


async def test_a_primary_killed_during_a_background_run(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, cluster: Cluster
) -> None:
    """SIGKILL of the primary that keeps a running background response: its replica is promoted
    and the run's writes, held in the run meanwhile (10.2), go there."""

    def kill(id: str) -> float:
        primary = cluster.node_of(f"x{{{id[:CHAIN_TAG]}}}")
        replica = cluster.replica_of(primary)
        until(lambda: caught_up(primary, replica), 5, "the replica holds what its primary kept")
        primary.stop()
        killed = time.monotonic()
        until(lambda: cluster.node_of(f"x{{{id[:CHAIN_TAG]}}}") is replica, 20, "the replica promoted")
        return time.monotonic() - killed

    await a_run_through_a_failover(upstream, start_proxy, http, cluster.url, kill)


async def test_a_chain_read_while_its_slot_migrates_is_whole(cluster: Cluster) -> None:
    """The newest record of a chain moved to the slot's new node, the older not yet: the walk,
    sent there (ASK), reads the older links as missing, and walks on from the source node rather
    than answer the chain cut short (a 400 to the client)."""
    backend = RedisBackend("", prefix(), 60, 100, 2.0, 8, cluster=parse_cluster(cluster.url))
    try:
        ids = ["resp_aaaaaaaa01", "resp_aaaaaaaa02", "resp_aaaaaaaa03"]
        for previous, id in zip([None, *ids], ids, strict=False):
            await backend.put(linked(id, previous), True, None)
        newest = backend._response_key(ids[-1])
        src, dst, _ = cluster.begin_migration(newest)
        with src, dst:
            cluster.move(src, dst, newest)
        chain, stopped = await backend.chain(ids[-1], "owner")
        assert [stored.id for stored in chain] == ids and stopped is None
    finally:
        await backend.close()


async def test_pipelines_sent_again_elsewhere_take_no_second_place(redis_cluster: Cluster) -> None:
    """A pipeline holds one of the `max_connections` places; its commands that a node redirects
    (MOVED: the client's map of the slots is stale, as right after a migration) are sent again
    within that place, so that as many pipelines as places, all redirected, do not wait on each
    other forever."""
    places = 2
    backend = RedisBackend("", prefix(), 60, 100, 2.0, places, cluster=parse_cluster(redis_cluster.url))
    client = backend._redis
    try:
        await client.set("a{x}", "1")
        await client.set("b{y}", "2")
        slots = client.nodes_manager.slots_cache
        right = slots[key_slot(b"a{x}")][0]
        slots[key_slot(b"a{x}")] = [next(node for node in client.get_primaries() if node.name != right.name)]
        async with asyncio.timeout(3):
            answers = await asyncio.gather(*(client.mget_nonatomic(["a{x}", "b{y}"]) for _ in range(places)))
        assert answers == [[b"1", b"2"]] * places
    finally:
        await backend.close()


@pytest.mark.parametrize("form", ["redis", "cluster"])
async def test_a_bound_lowered_far_is_reached_over_later_puts(request: pytest.FixtureRequest, form: str) -> None:
    """design.md 9.1: a key holding 9,000 responses over its bound (its `max_responses` lowered)
    loses at most 100 a put, each put kept (Lua's `unpack` fails past about 8,000 values)."""
    url = request.getfixturevalue("redis_cluster").url if form == "cluster" else request.getfixturevalue("redis_server").url
    backend = RedisBackend(url, prefix(), 60, 5, 2.0, 8, cluster=parse_cluster(url) if form == "cluster" else None)
    try:
        owned = backend._owned("owner")
        await backend._redis.zadd(owned, {f"resp_{n:08}old": int(time.time()) - 10 for n in range(9_000)})
        for n in range(3):
            await backend.put(linked(f"resp_{n:08}new", None), True, None)
            assert await backend._redis.zcard(owned) == 9_000 + n + 1 - 100 * (n + 1)
        assert [stored.id for stored in (await backend.recent("owner", None, 3))] == [f"resp_{n:08}new" for n in (2, 1, 0)]
    finally:
        await backend.close()
