"""The Redis store behind Sentinel (`store.url: redis+sentinel://...`, design.md 9.1): real
processes, a primary, its replica and three sentinels. The proxy stores and chains through the
primary the sentinels name, and goes on through a failover: a request during the switch is a
503 `store_unavailable` or answered, in time, and a response kept before it is read after it.
The store protocol tests of test_store.py run here again against this form."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config import ConfigError, parse, sentinel_address
from proxy.store.redis import RedisBackend
from tests import test_store as protocol
from tests.client import envelope
from tests.fake_upstream import FakeUpstream, Reply
from tests.redis_server import SentinelGroup, sentinel_binary
from tests.test_store import create, get, proxy_config, text_turn
from tests.test_store_cluster import a_run_through_a_failover

pytestmark = pytest.mark.skipif(
    sentinel_binary() is None,
    reason="no redis-sentinel nor redis-server (to run as `redis-server --sentinel`): apt-get install redis-server",
)


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """One group for the tests that leave its primary alone; each keeps its keys under a prefix."""
    with SentinelGroup(tmp_path_factory.mktemp("sentinel")) as group:
        yield group


@pytest.fixture(params=["sentinel"])
def store(request: pytest.FixtureRequest, sentinel_group: SentinelGroup) -> dict[str, Any]:
    """test_store.py's backends, here the one behind Sentinel: its tests below use this one."""
    return {"url": sentinel_group.url(), "prefix": f"test-{uuid.uuid4().hex}:"}


# test_store.py's tests of the store protocol (those on the `store` fixture), collected here as
# well, where `store` is the Sentinel form above.
stored_proxy = protocol.stored_proxy
for _name, _test in vars(protocol).items():
    if _name.startswith("test_") and {"store", "stored_proxy"} & set(inspect.signature(_test).parameters):
        globals()[_name] = _test


async def test_a_response_is_kept_and_chained_through_the_sentinels_primary(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    url = await start_proxy(proxy_config(upstream, store))
    upstream.script(Reply(text_turn("One")), Reply(text_turn("Two")))
    first = await create(http, url, {"model": "m", "input": "hi"}, stream=False)
    second = await create(http, url, {"model": "m", "input": "again", "previous_response_id": first["id"]}, stream=True)
    assert second["previous_response_id"] == first["id"]
    chat = upstream.requests[-1]["messages"]
    assert [m["content"] for m in chat] == ["hi", "One", "again"]
    status, body = await get(http, url, second["id"])
    assert status == 200 and body["output"][0]["content"][0]["text"] == "Two"


async def test_a_full_pool_is_waited_for(sentinel_group: SentinelGroup) -> None:
    """The pool behind Sentinel waits for a connection as the plain one does (9.8): calls past
    `max_connections` queue, none fails for want of one."""
    url = sentinel_group.url()
    backend = RedisBackend(url, f"test-{uuid.uuid4().hex}:", 60, 100, 2.0, max_connections=1, sentinel=sentinel_address(url))
    try:
        # Each read holds the one connection for its 0.05 s wait on an empty stream.
        answers = await asyncio.gather(*(backend.read("none", 0, 0.05) for _ in range(4)))
        assert answers == [[]] * 4
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://127.0.0.1:1/", "redis+sentinel:///service", "redis+sentinel://h:port/s", "redis+sentinel://h/s/x"],
)
def test_a_sentinel_url_without_sentinels_or_service_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^store\.url: "):
        parse({"upstreams": [{"name": "default", "urls": ["http://127.0.0.1:1"]}], "store": {"url": url}})


async def test_the_store_follows_a_failover(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The primary killed: the sentinels promote the replica within 15 s; meanwhile each request
    is answered or a 503 `store_unavailable`, within the store's timeout (never a hang nor a 500),
    and then a response kept before the kill is read, chained, and new ones are kept."""
    with SentinelGroup(tmp_path) as group:
        timeout = 1.0
        url = await start_proxy(proxy_config(upstream, {"url": group.url(), "timeout": timeout}))
        upstream.script(Reply(text_turn("Kept")))
        kept = await create(http, url, {"model": "m", "input": "hi"}, stream=False)
        group.until(group.caught_up, 5, "the replica has the kept response")

        group.kill_primary()
        killed = time.monotonic()
        # A write the store fails costs no answer (9.1).
        lost = await create(http, url, {"model": "m", "input": "lost?"}, stream=True)
        assert lost["status"] == "completed" and time.monotonic() - killed < 2.5 * timeout
        statuses = []
        while True:
            started = time.monotonic()
            async with http.get(
                f"{url}/v1/responses/{kept['id']}", timeout=aiohttp.ClientTimeout(total=5 * timeout)
            ) as response:
                status, body = response.status, await response.json()
            # One store read, bounded by the store's time (9.1), and a retry of its connection.
            assert time.monotonic() - started < 2.5 * timeout
            statuses.append(status)
            if status == 200:
                break
            assert status == 503 and envelope(body, "store_unavailable")
            assert time.monotonic() - killed < 15, f"no primary again within 15 s: {statuses}"
            await asyncio.sleep(0.1)
        assert group.primary_port() == group.replica.port
        assert body["output"][0]["content"][0]["text"] == "Kept"

        upstream.script(Reply(text_turn("After")))
        after = await create(http, url, {"model": "m", "input": "on", "previous_response_id": kept["id"]}, stream=False)
        assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["hi", "Kept", "on"]
        status, body = await get(http, url, after["id"])
        assert status == 200 and body["output"][0]["content"][0]["text"] == "After"



async def test_a_failover_during_a_background_run(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The primary killed while a background run writes its events: the sentinels promote the
    replica, and the run's writes held meanwhile (10.2) go there; nothing lost, nothing twice."""
    group = SentinelGroup(tmp_path)

    def kill(id: str) -> float:
        group.until(group.caught_up, 5, "the replica holds what its primary kept")
        group.kill_primary()
        return group.wait_failover(20)

    with group:
        await a_run_through_a_failover(upstream, start_proxy, http, group.url(), kill)
