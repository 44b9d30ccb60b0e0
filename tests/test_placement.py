"""A new session placed where its prompt's prefix was sent (design.md 11.5): the longest prefix a
replica within the bound on sessions holds, ties broken by the prompt, the index shared through
a Redis store, what the usage's cached tokens teach, and tenants' caches kept apart by
`cache_salt` (11.6). The replicas are fake upstreams on loopback; the proxy is the real one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from proxy.config import Config, parse
from proxy.store.redis import RedisBackend
from tests.client import eventually, post_json
from tests.client import stream as streamed
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import sample, scrape
from tests.redis_server import RedisServer

PRODUCT = "You are the review agent of a code forge. Read the diff, then the tests. " * 150  # ~11 KB
OTHER = "You are the release agent: write the changelog from the merged pull requests. " * 150
# `timeouts.first_byte` where a test waits it out: a prefix sent longer ago has been computed,
# so that a miss on it is an eviction (design.md 11.5).
PREFILLED = 1.0


def answer(cached: int = 2900) -> Reply:
    """An answer to a prompt of 3000 tokens, `cached` of them found in the replica's cache."""
    steps = [Step("text", "ok"), Step("finish", finish_reason="stop")]
    return Reply(Generation(steps, completion_tokens=1, prompt_tokens=3000, cached_tokens=cached))


@asynccontextmanager
async def replicas(n: int, *script: Reply) -> AsyncIterator[list[FakeUpstream]]:
    """`n` fake upstreams, each answering `script` in turn (then its last reply), closed after."""
    fleet = [FakeUpstream() for _ in range(n)]
    try:
        for replica in fleet:
            await replica.start()
            replica.script(*(script or [answer()]))
        yield fleet
    finally:
        for replica in fleet:
            await replica.close()


@pytest.fixture
async def two() -> AsyncIterator[list[FakeUpstream]]:
    async with replicas(2) as fleet:
        yield fleet


@pytest.fixture
async def three() -> AsyncIterator[list[FakeUpstream]]:
    async with replicas(3) as fleet:
        yield fleet


def fleet_config(fleet: list[FakeUpstream], store: dict[str, Any] | None = None, top: dict[str, Any] | None = None, **upstream: Any) -> Config:
    section = {"name": "fleet", "urls": [replica.url for replica in fleet], **upstream}
    return parse({"upstreams": [section], "store": store or {"url": "none"}, **(top or {})})


async def session(http: aiohttp.ClientSession, url: str, fleet: list[FakeUpstream], key: str, instructions: str = PRODUCT, *, context: str | None = None, **body: Any) -> int:
    """A new session's first turn, as an agent sends it: its product's instructions, its own
    context after them where given, the task; which replica served it."""
    said: list[dict[str, Any]] = [{"type": "message", "role": "developer", "content": context}] if context else []
    said.append({"type": "message", "role": "user", "content": f"the task of {key}"})
    before = [len(replica.requests) for replica in fleet]
    body = {"model": "m", "instructions": instructions, "input": said, "prompt_cache_key": key, **body}
    status, answered = await post_json(http, f"{url}/v1/responses", body)
    assert status == 200, answered
    served = [i for i, replica in enumerate(fleet) if len(replica.requests) > before[i]]
    assert len(served) == 1
    return served[0]


async def test_a_new_session_goes_where_the_longest_prefix_it_shares_was_sent(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: the first session of a product goes by the prompt's own order, the next
    where its instructions were sent, up to one more than the mean; past it, one that adds its
    context after the instructions goes to the least loaded (the other); the next such session
    goes where that longer prefix went, though the shorter one is held within the bound too."""
    url = await start_proxy(fleet_config(two, store))
    home = await session(http, url, two, "plain 0")
    assert await session(http, url, two, "plain 1") == home  # 2 <= 2 / 2 + 1
    longer = await session(http, url, two, "with context 1", context="the repository: forge/web")
    assert longer != home  # 3 > 3 / 2 + 1
    assert await session(http, url, two, "with context 2", context="the repository: forge/web") == longer
    metrics = await scrape(http, url)
    assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="prefix") == 2
    assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="new") == 2


async def test_proxies_that_share_nothing_place_a_prompt_alike(three: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: ties are broken by the prompt, not the session: two gateway replicas
    without a shared store send two sessions of one prompt to the same replica."""
    one = await start_proxy(fleet_config(three))
    other = await start_proxy(fleet_config(three))
    for product in range(6):
        instructions = f"Product {product}. {PRODUCT}"
        mine = await session(http, one, three, f"{product} on one", instructions)
        assert await session(http, other, three, f"{product} on the other", instructions) == mine


async def test_the_bound_counts_the_sessions_each_replica_holds(two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: one product's sessions fill its replica up to 1.25 times the mean of the
    sessions held, then the others."""
    url = await start_proxy(fleet_config(two))
    served = [await session(http, url, two, f"session {i}") for i in range(8)]
    assert max(served.count(0), served.count(1)) <= 5


async def test_a_replica_a_known_session_would_spill_from_takes_no_new_one(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession
) -> None:
    """design.md 11.5: where its prefix was sent carries as many requests in flight as a known
    session spills at (11.2): a new session of that prompt goes to the other replica."""
    url = await start_proxy(fleet_config(two))
    home = await session(http, url, two, "first")
    assert await session(http, url, two, "another product", OTHER) != home  # one session each
    two[home].script(*[Reply(answer().generation, stall_after=1)] * 3)
    body = {"model": "m", "instructions": PRODUCT, "input": "go on", "prompt_cache_key": "first", "stream": True}
    streams = [asyncio.create_task(post_json(http, f"{url}/v1/responses", body)) for _ in range(3)]
    try:
        await eventually(lambda: two[home].active_streams == 3, 5)  # max(ceil(1.25 * (3 + 1) / 2), 4 / 2 + 1) = 3
        two[home].script(answer())
        assert await session(http, url, two, "second") != home
    finally:
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


async def test_only_sessions_active_within_the_window_count(two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: a session counts while its last call is within `session_window`: one
    idle past it leaves its replica's share to the next session of its prompt; one whose turns
    go on is counted."""
    url = await start_proxy(fleet_config(two, session_window=0.5))
    home = await session(http, url, two, "first")
    for i in range(3):
        await asyncio.sleep(0.6)
        assert await session(http, url, two, f"after a pause {i}") == home
    await asyncio.sleep(0.6)
    busy = ["busy", "busy too"]
    assert [await session(http, url, two, key) for key in busy] == [home, home]  # 2 <= 2 / 2 + 1
    for _ in range(3):  # their later turns, each within the window of the last
        await asyncio.sleep(0.3)
        for key in busy:
            await session(http, url, two, key)
    assert await session(http, url, two, "beside two busy ones") != home  # 3 > 3 / 2 + 1


@pytest.mark.parametrize("dialect", ["sglang", "vllm", "llama.cpp"])
async def test_a_new_session_goes_where_its_prefix_is_being_computed(start_proxy, http: aiohttp.ClientSession, dialect: str) -> None:
    """design.md 11.5: a replica holds a new session's prefix from when it is sent: the next
    session of the prompt goes there rather than to the least loaded replica; on SGLang, whose
    cache shares a prefix once prefilled, it waits for the first's prefill, which ends at its
    first token, not at the headers SGLang sends before it. A llama-server shares a prompt only
    by handing one slot's cache to the next task: there it goes at once, beside the first."""
    released = asyncio.Event()
    async with replicas(2, Reply(answer().generation, hold=released), answer()) as two:
        url = await start_proxy(fleet_config(two, dialect=dialect))
        body = {"model": "m", "instructions": PRODUCT, "input": "the first task", "prompt_cache_key": "first"}
        first = asyncio.create_task(streamed(http, url, body))
        await eventually(lambda: sum(len(replica.requests) for replica in two) == 1, 5)
        home = next(i for i, replica in enumerate(two) if replica.requests)
        second = asyncio.create_task(session(http, url, two, "second"))
        await asyncio.sleep(0.5)  # the first's headers sent, its first token not yet
        assert len(two[home].requests) == (2 if dialect == "llama.cpp" else 1)
        released.set()
        assert (await first)[-1]["type"] == "response.completed"
        assert await second == home
        metrics = await scrape(http, url)
        assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="prefix") == 1


async def test_a_session_whose_client_leaves_while_it_waits_for_its_prefix_is_never_sent(
    start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: a session waiting for its prefix to be computed for another, whose
    client goes away, is never sent: nothing generates for nobody, it no longer counts on the
    replica (the next session of the prompt goes there too, within the bound) and the next
    waits for the first alone."""
    released = asyncio.Event()
    async with replicas(2, Reply(answer().generation, hold=released), answer()) as two:
        url = await start_proxy(fleet_config(two, store))
        body = {"model": "m", "instructions": PRODUCT, "input": "the first task", "prompt_cache_key": "first"}
        first = asyncio.create_task(streamed(http, url, body))
        await eventually(lambda: sum(len(replica.requests) for replica in two) == 1, 5)
        home = next(i for i, replica in enumerate(two) if replica.requests)
        gone = asyncio.create_task(session(http, url, two, "gone"))
        await asyncio.sleep(0.3)  # waiting for the first's first token
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        later = asyncio.create_task(session(http, url, two, "later"))
        await asyncio.sleep(0.3)
        assert [len(replica.requests) for replica in two][home] == 1
        released.set()
        assert (await first)[-1]["type"] == "response.completed"
        assert await later == home
        assert sum(len(replica.requests) for replica in two) == 2  # the first and the later one


async def test_sessions_that_come_together_wait_no_further_than_the_bound(start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: a session that waits for its prefix counts where it waits: four sessions
    of one prompt that come while the first is being computed are placed two and two, not all
    where the first is (the first the others waited for, each counted only once sent)."""
    async with replicas(2, Reply(answer().generation, headers_delay=0.3)) as two:
        url = await start_proxy(fleet_config(two))

        async def begun(key: str) -> None:
            body = {"model": "m", "instructions": PRODUCT, "input": f"the task of {key}", "prompt_cache_key": key}
            assert (await post_json(http, f"{url}/v1/responses", body))[0] == 200

        first = asyncio.create_task(begun("first"))
        await eventually(lambda: sum(len(replica.requests) for replica in two) == 1, 5)
        await asyncio.gather(first, *(begun(f"beside {i}") for i in range(3)))
        assert sorted(len(replica.requests) for replica in two) == [2, 2]


async def test_gateway_replicas_share_where_prefixes_were_sent(
    three: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: with a Redis store, a gateway replica places a new session where another
    sent its prefix; without, each keeps its own index (a SQLite store is one process's)."""
    alone = await start_proxy(fleet_config(three))
    first = await session(http, alone, three, "probe")  # the prompt's own first choice
    port = int(three[first].url.rsplit(":", 1)[1])
    await three[first].close()
    one = await start_proxy(fleet_config(three, store, eject_seconds=30, load_factor=10))
    elsewhere = await session(http, one, three, "while its first choice is down")
    assert elsewhere != first
    await three[first].start(port=port)
    three[first].script(answer())
    other = await start_proxy(fleet_config(three, store, load_factor=10))  # the bound out of the way
    shared = not store["url"].startswith("sqlite")
    assert await session(http, other, three, "on another gateway") == (elsewhere if shared else first)


async def test_a_session_that_moves_takes_back_only_what_it_claimed(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: a new session placed for its prefix on a replica that then refuses it
    goes to the next, and takes back there only what it claimed past its match: what another
    session sent the first stays (the prefix it may still hold once back)."""
    url = await start_proxy(fleet_config(two, store, load_factor=10, eject_seconds=0.5))
    home = await session(http, url, two, "first")
    port = int(two[home].url.rsplit(":", 1)[1])
    await two[home].close()
    assert await session(http, url, two, "refused there") != home
    await two[home].start(port=port)
    two[home].script(answer())
    await asyncio.sleep(0.6)  # past its ejection
    assert await session(http, url, two, "once it is back") == home


async def test_gateway_replicas_see_a_prefix_from_when_it_is_sent(start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """design.md 11.5: a new session's prefix is in the index from when it is sent, not once its
    answer begins (a cold prefix takes seconds): with a Redis store, another gateway replica
    places the next session of the prompt there for its prefix while the first is computed."""
    async with replicas(2, Reply(answer().generation, headers_delay=1.0), answer()) as two:
        one = await start_proxy(fleet_config(two, store))
        other = await start_proxy(fleet_config(two, store))
        body = {"model": "m", "instructions": PRODUCT, "input": "the first task", "prompt_cache_key": "first"}
        first = asyncio.create_task(post_json(http, f"{one}/v1/responses", body))
        await eventually(lambda: sum(len(replica.requests) for replica in two) == 1, 5)
        home = next(i for i, replica in enumerate(two) if replica.requests)
        assert await session(http, other, two, "second") == home  # its first choice too, shared or not
        assert not first.done()
        shared = not store["url"].startswith("sqlite")
        metrics = await scrape(http, other)
        assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="prefix" if shared else "new") == 1
        assert (await first)[0] == 200


async def test_gateway_replicas_count_each_others_sessions(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: with a Redis store, the sessions each replica holds are counted over every
    gateway replica: two sessions one placed on a replica send the other's new prompts to the
    other replica; without, each counts its own, and splits them."""
    one = await start_proxy(fleet_config(two, store))
    other = await start_proxy(fleet_config(two, store))
    home = await session(http, one, two, "first")
    assert await session(http, one, two, "second") == home
    placed = [await session(http, other, two, f"of product {i}", f"You are agent {i}. " * 200) for i in range(2)]
    shared = not store["url"].startswith("sqlite")
    assert placed == [1 - home] * 2 if shared else sorted(placed) == [0, 1]


async def test_a_new_session_costs_one_store_round_trip_more_than_a_known_one(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    """design.md 11.5: with a Redis store, a known session's call reads the map (one round
    trip); a new session's reads the map, then the index and the sessions held (one), then
    writes where it went (one): one more than the map's read and write it took before. Counted
    as the proxy's writes to Redis, each a command or a pipeline, through a relay."""
    writes = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", redis_server.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, counted: bool) -> None:
            nonlocal writes
            while data := await source.read(65536):
                writes += counted
                sink.write(data)
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer, True), pipe(upstream_reader, writer, False))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    store = {"url": f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0", "prefix": "round-trips:"}
    try:
        url = await start_proxy(fleet_config(two, store))
        await session(http, url, two, "the connection opened", OTHER, store=False)
        before = writes
        await session(http, url, two, "new", OTHER, store=False)
        new = writes - before
        before = writes
        body = {"model": "m", "instructions": OTHER, "input": "a later turn", "prompt_cache_key": "new", "store": False}
        assert (await post_json(http, f"{url}/v1/responses", body))[0] == 200
        assert (new, writes - before) == (3, 1)
    finally:
        server.close()


async def test_a_session_is_reported_to_the_shared_count_while_it_is_active(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    """design.md 11.5: with a Redis store a replica's sessions are a sorted set, each scored by
    when a gateway last reported it: at its placement, then at most a quarter of
    `session_window` apart while its calls go on, so that it keeps counting there."""
    prefix = "reports:"
    url = await start_proxy(fleet_config(two, {"url": redis_server.url, "prefix": prefix}, session_window=2))
    home = await session(http, url, two, "agent", store=False)
    held = f"{prefix}held:fleet:{two[home].url}"
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        placed = await client.zscore(held, "agent")
        assert placed is not None

        async def turn() -> float | None:
            body = {"model": "m", "instructions": PRODUCT, "input": "go on", "prompt_cache_key": "agent", "store": False}
            assert (await post_json(http, f"{url}/v1/responses", body))[0] == 200
            return await client.zscore(held, "agent")

        assert await turn() == placed  # reported a moment ago
        await asyncio.sleep(0.6)  # past a quarter of the window
        assert (await turn() or 0) > placed
    finally:
        await client.aclose()


async def test_a_failing_index_in_redis_costs_a_new_session_little() -> None:
    """design.md 11.5: an index that does not answer within 0.25 s is a placement without it."""
    heard: list[bytes] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            heard.append(data)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", "test:", 60, 100, 2.0, 100)
    try:
        index = backend.affinity("fleet", 60, 300)
        assert await asyncio.wait_for(index.view(["a", "b"], ["http://r1"]), 1) == ([], None)
        asked = len(heard)
        await asyncio.wait_for(index.set("session", "http://r1", ["a", "b"]), 0.05)
        await asyncio.wait_for(index.forget(["a"], "http://r1"), 0.05)
        assert await asyncio.wait_for(index.view(["a"], ["http://r1"]), 0.05) == ([], None)
        assert len(heard) == asked  # left alone meanwhile
    finally:
        await backend.close()
        server.close()


@pytest.mark.parametrize("dialect", ["sglang", "llama.cpp"])
async def test_a_replica_found_without_the_prefix_is_forgotten_for_it(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any], dialect: str
) -> None:
    """design.md 11.5: a session placed for its prefix whose answer found far fewer tokens
    cached than it matched tells the proxy its replica evicted it: the next session goes by
    load; one that found it keeps it there. On SGLang one that missed a prefix sent within
    `timeouts.first_byte`, which may still be being prefilled for the session before it, says
    nothing; on a llama-server, whose busy slots share nothing, it says the replica cannot
    share it. (A loose bound, so that only the index decides.)"""
    for replica in two:  # after the first answer
        replica.script(answer(cached=2900), answer(cached=100))
    config = fleet_config(two, store, load_factor=10, dialect=dialect, timeouts={"first_byte": PREFILLED})
    url = await start_proxy(config)
    home = await session(http, url, two, "first")
    await asyncio.sleep(PREFILLED)
    assert await session(http, url, two, "found it cached") == home
    assert await session(http, url, two, "missed it just after it was sent") == home
    await asyncio.sleep(0.1)
    if dialect == "llama.cpp":
        assert await session(http, url, two, "elsewhere") != home
        return
    assert await session(http, url, two, "still there") == home
    await asyncio.sleep(PREFILLED)
    assert await session(http, url, two, "found it evicted") == home
    await asyncio.sleep(0.1)  # the index is told after the answer, without delaying it
    assert await session(http, url, two, "after the eviction") != home


async def test_an_upstream_that_counts_no_cached_tokens_teaches_nothing(two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: an answer whose usage counts no cached tokens at all (SGLang without
    `--enable-cache-report`, vLLM without `--enable-prompt-tokens-details`) says nothing of
    what its replica held: the prefix stays in the index."""
    for replica in two:  # after the first answer
        replica.script(answer(cached=0))  # as SGLang sends it without its cache report
    url = await start_proxy(fleet_config(two, load_factor=10, timeouts={"first_byte": PREFILLED}))
    home = await session(http, url, two, "first")
    for key in ("counted nothing", "nor this one"):
        await asyncio.sleep(PREFILLED)
        assert await session(http, url, two, key) == home


@pytest.mark.parametrize("stream", [False, True])
async def test_a_relayed_chat_call_teaches_the_index_too(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, stream: bool
) -> None:
    """design.md 11.5: a relayed chat call placed for its prefix is read for its usage as its
    bytes pass (a whole body, or a stream's usage chunk): found evicted, its prefix is
    forgotten on its replica, as a translated call's is."""
    for replica in two:  # after the first answer
        replica.script(answer(cached=100))
    url = await start_proxy(fleet_config(two, load_factor=10, timeouts={"first_byte": PREFILLED}))
    home = await session(http, url, two, "first")
    await asyncio.sleep(PREFILLED)
    messages = [{"role": "system", "content": PRODUCT}, {"role": "user", "content": "a relayed task"}]
    body: dict[str, Any] = {"model": "m", "messages": messages, "prompt_cache_key": "relayed", "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        relayed = await response.read()
    assert b"cached_tokens" in relayed and len(two[home].requests) == 2  # placed for its prefix, found it evicted
    await asyncio.sleep(0.1)
    assert await session(http, url, two, "after the eviction") != home


async def test_a_background_run_teaches_the_index_too(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: a background run's usage is its client's alone for the metrics (11.4),
    but what its replica had cached places the next sessions as a foreground call's does."""
    for replica in two:  # after the first answer
        replica.script(answer(cached=100))
    url = await start_proxy(fleet_config(two, store, load_factor=10, timeouts={"first_byte": PREFILLED}))
    home = await session(http, url, two, "first")
    await asyncio.sleep(PREFILLED)
    body = {"model": "m", "instructions": PRODUCT, "input": "the task", "prompt_cache_key": "in the background", "background": True}
    status, queued = await post_json(http, f"{url}/v1/responses", body)
    assert status == 200, queued

    async def ended() -> bool:
        async with http.get(f"{url}/v1/responses/{queued['id']}") as response:
            return (await response.json())["status"] == "completed"

    await eventually(ended, 5)
    assert len(two[home].requests) == 2  # placed for its prefix, found it evicted
    await asyncio.sleep(0.1)
    assert await session(http, url, two, "after the eviction") != home


async def test_a_prefix_sent_again_stays_in_the_index(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.5: a prefix is known `affinity_ttl` seconds after it was last sent."""
    url = await start_proxy(fleet_config(two, store, load_factor=10, affinity_ttl=2))
    home = await session(http, url, two, "first")
    await asyncio.sleep(1.3)
    assert await session(http, url, two, "within its time") == home
    await asyncio.sleep(1.3)  # past the first send's time, within the second's
    assert await session(http, url, two, "renewed") == home
    await asyncio.sleep(2.2)
    assert await session(http, url, two, "forgotten") != home  # the least loaded


async def test_a_cache_salt_goes_upstream_and_tenants_prefixes_are_placed_apart(
    two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession
) -> None:
    """design.md 11.6: a client's cache_salt is sent upstream; an upstream set to `per_key`
    salts each API key's calls with one of its own, which the client's salt splits but never
    joins to another key's; the salt begins every placement key, so that two tenants' same
    prompt is two prefixes."""
    url = await start_proxy(fleet_config(two, load_factor=10))
    assert two[await session(http, url, two, "salted", cache_salt="team a")].requests[-1]["cache_salt"] == "team a"
    assert "cache_salt" not in two[await session(http, url, two, "plain")].requests[-1]
    status, refused = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi", "cache_salt": ""})
    assert status == 400 and refused["error"]["param"] == "cache_salt"

    for replica in two:
        replica.requests.clear()
    keys = {"auth": {"api_keys": ["key-a", "key-b"]}}
    url = await start_proxy(fleet_config(two, top=keys, load_factor=10, cache_salt="per_key"))

    async def salted(api_key: str, key: str, **body: Any) -> tuple[int, str]:
        before = [len(replica.requests) for replica in two]
        status, answered = await post_json(
            http, f"{url}/v1/responses",
            {"model": "m", "instructions": PRODUCT, "input": f"the task of {key}", "prompt_cache_key": key, **body},
            headers={"Authorization": f"Bearer {api_key}"},
        )
        assert status == 200, answered
        served = next(i for i, replica in enumerate(two) if len(replica.requests) > before[i])
        return served, two[served].requests[-1]["cache_salt"]

    home, a = await salted("key-a", "a 1")
    tenant_b, b = await salted("key-b", "b 1")
    assert tenant_b != home  # the same prompt, another prefix: the least loaded
    assert a != b and await salted("key-a", "a 2") == (home, a)
    split = (await salted("key-a", "a 3", cache_salt="project x"))[1]
    assert split not in (a, b, "project x")
    assert (await salted("key-b", "b 2", cache_salt="project x"))[1] not in (a, b, split)

    async def relayed(api_key: str, **body: Any) -> str:
        before = [len(replica.requests) for replica in two]
        chat = {"model": "m", "messages": [{"role": "system", "content": PRODUCT}, {"role": "user", "content": "hi"}], **body}
        status, answered = await post_json(http, f"{url}/v1/chat/completions", chat, headers={"Authorization": f"Bearer {api_key}"})
        assert status == 200, answered
        return next(replica for i, replica in enumerate(two) if len(replica.requests) > before[i]).requests[-1]["cache_salt"]

    # A relayed chat call is salted as a translated one: its key's salt, split by its own.
    assert [await relayed("key-a"), await relayed("key-b"), await relayed("key-a", cache_salt="project x")] == [a, b, split]
    status, refused = await post_json(
        http, f"{url}/v1/chat/completions", {"model": "m", "messages": [], "cache_salt": 7}, headers={"Authorization": "Bearer key-a"}
    )
    assert status == 400 and refused["error"]["param"] == "cache_salt"


async def test_relayed_chat_calls_are_placed_by_their_prefix(two: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.5: a relayed /v1/chat/completions call's leading messages place it too."""
    url = await start_proxy(fleet_config(two, load_factor=10))
    served = []
    for i in range(3):
        before = [len(replica.requests) for replica in two]
        messages = [{"role": "system", "content": PRODUCT}, {"role": "user", "content": f"task {i}"}]
        status, answered = await post_json(http, f"{url}/v1/chat/completions", {"model": "m", "messages": messages, "user": f"session {i}"})
        assert status == 200, answered
        served += [j for j, replica in enumerate(two) if len(replica.requests) > before[j]]
    assert len(set(served)) == 1
