"""Sessions across a fleet (design.md 11): every turn of a session goes to the replica that
served the last, within a bound on load; a spill moves it once; two gateway replicas on one
Redis agree; an upstream that routes sessions itself is told the key; cached prompt tokens are
reported. The replicas are fake upstreams on loopback; the proxy is the real one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config import Config, parse
from proxy.store.redis import RedisBackend
from tests.client import eventually, post_json
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import sample, scrape

HI = Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")], completion_tokens=1)
LONG = Generation([*(Step("text", f"w{i} ") for i in range(40)), Step("finish", finish_reason="stop")])


@pytest.fixture
async def fleet() -> AsyncIterator[list[FakeUpstream]]:
    replicas = [FakeUpstream() for _ in range(3)]
    for replica in replicas:
        await replica.start()
        replica.script(Reply(HI))
    yield replicas
    for replica in replicas:
        await replica.close()


def fleet_config(fleet: list[FakeUpstream], store: dict[str, Any] | None = None, **upstream_keys: Any) -> Config:
    upstream = {"name": "fleet", "urls": [replica.url for replica in fleet], **upstream_keys}
    return parse({"upstreams": [upstream], "store": store or {"url": "none"}})


def counts(fleet: list[FakeUpstream]) -> list[int]:
    return [len(replica.requests) for replica in fleet]


async def turn(http: aiohttp.ClientSession, url: str, fleet: list[FakeUpstream], body: dict[str, Any], **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """One call; which replica served it, and the answer."""
    before = counts(fleet)
    status, answer = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi", **body}, **kwargs)
    assert status == 200, answer
    after = counts(fleet)
    served = [i for i in range(len(fleet)) if after[i] > before[i]]
    assert len(served) == 1, (before, after)
    return served[0], answer


async def test_every_turn_of_a_session_goes_to_one_replica(fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.1-11.2: whatever names the session (its prompt_cache_key, a header, its first
    turn), its turns stay on one replica; sessions spread over the replicas."""
    url = await start_proxy(fleet_config(fleet))
    homes = set()
    for i in range(12):
        served = {(await turn(http, url, fleet, {"prompt_cache_key": f"conversation {i}"}))[0] for _ in range(4)}
        assert len(served) == 1
        homes |= served
    assert len(homes) >= 2
    for i in range(6):
        headers = {"session_id": f"codex session {i}"}
        assert len({(await turn(http, url, fleet, {}, headers=headers))[0] for _ in range(3)}) == 1
    first = [{"type": "message", "role": "developer", "content": "you are an agent"}, {"type": "message", "role": "user", "content": "task 7"}]
    later = [*first, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    tools = [{"type": "function", "name": "f"}]
    assert len({(await turn(http, url, fleet, {"input": body, "tools": tools}))[0] for body in (first, later, later)}) == 1


async def test_least_outstanding_balances_each_call_alone(fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(fleet_config(fleet, balance="least_outstanding"))
    served = {(await turn(http, url, fleet, {"prompt_cache_key": "one"}))[0] for _ in range(6)}
    assert served == {0, 1, 2}  # ties taken in turn


async def test_a_replica_that_fails_spills_the_session_which_stays_where_it_went(
    fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession
) -> None:
    """design.md 11.2: a session whose replica is down goes to the next of its own order, and
    keeps that one when the first comes back (the new one has its prefix now)."""
    url = await start_proxy(fleet_config(fleet, eject_seconds=0.2))
    body = {"prompt_cache_key": "agent"}
    home, _ = await turn(http, url, fleet, body)
    port = int(fleet[home].url.rsplit(":", 1)[1])
    await fleet[home].close()
    spilled, _ = await turn(http, url, fleet, body)
    assert spilled != home
    await fleet[home].start(port=port)
    fleet[home].script(Reply(HI))
    await asyncio.sleep(0.3)  # past its ejection
    assert {(await turn(http, url, fleet, body))[0] for _ in range(3)} == {spilled}
    metrics = await scrape(http, url)
    assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="spill") == 1
    assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="hit") == 3
    assert sample(metrics, "proxy_session_routes_total", upstream="fleet", outcome="new") == 1


async def test_a_replica_over_the_bound_spills_the_session(fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 11.2: while its replica carries load_factor times the mean in flight, a
    session's call goes elsewhere; another session's stream is what loads it."""
    url = await start_proxy(fleet_config(fleet))
    home, _ = await turn(http, url, fleet, {"prompt_cache_key": "agent"})
    neighbour = None
    for i in range(200):  # a session whose own order puts it on the same replica
        served, _ = await turn(http, url, fleet, {"prompt_cache_key": f"other {i}"})
        if served == home:
            neighbour = f"other {i}"
            break
    assert neighbour is not None
    fleet[home].script(Reply(LONG, stall_after=3), Reply(LONG, stall_after=3))
    body = {"model": "m", "input": "hi", "stream": True, "prompt_cache_key": neighbour}
    streams = [asyncio.create_task(post_json(http, f"{url}/v1/responses", body)) for _ in range(2)]
    try:
        await eventually(lambda: fleet[home].active_streams == 2, 5)
        fleet[home].script(Reply(HI))
        # Two in flight, on `home`: the bound is max(ceil(1.25 * 3 / 3), ceil(3 / 3) + 1) = 2.
        spilled = (await turn(http, url, fleet, {"prompt_cache_key": "agent"}))[0]
        assert spilled != home
    finally:
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    assert {(await turn(http, url, fleet, {"prompt_cache_key": "agent"}))[0] for _ in range(3)} == {spilled}  # it stays


async def test_a_chained_turn_goes_where_the_response_it_continues_was_made(
    fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 11.1: `previous_response_id` carries the session (kept with the stored response)
    to a turn that names none, and the replica that served it."""
    url = await start_proxy(fleet_config(fleet, store))
    for i in range(6):  # keyed first turns: a chained turn's own first-turn digest would go elsewhere
        home, last = await turn(http, url, fleet, {"input": "a conversation of its own", "prompt_cache_key": f"chain {i}"})
        for _ in range(2):
            served, last = await turn(http, url, fleet, {"input": "and then?", "previous_response_id": last["id"]})
            assert served == home


async def test_two_gateway_replicas_on_one_redis_agree_after_a_spill(
    fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession, redis_server: Any
) -> None:
    """design.md 11.3: the session map is in Redis: a session one gateway replica spilled goes
    where it went on the other too, though that one's own order would have sent it home."""
    store = {"url": redis_server.url, "prefix": "test-sessions-agree:"}
    one = await start_proxy(fleet_config(fleet, store, eject_seconds=30))
    body = {"prompt_cache_key": "shared agent"}
    home, _ = await turn(http, one, fleet, body)
    port = int(fleet[home].url.rsplit(":", 1)[1])
    await fleet[home].close()
    spilled, _ = await turn(http, one, fleet, body)
    await fleet[home].start(port=port)
    fleet[home].script(Reply(HI))
    other = await start_proxy(fleet_config(fleet, store))
    assert {(await turn(http, other, fleet, body))[0] for _ in range(3)} == {spilled}
    alone = await start_proxy(fleet_config(fleet))  # no shared map: its own order alone
    assert (await turn(http, alone, fleet, body))[0] == home


@pytest.mark.parametrize("relayed", [False, True], ids=["responses", "chat"])
async def test_the_session_key_is_forwarded_to_an_upstream_that_routes_sessions(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, relayed: bool
) -> None:
    """design.md 11.4: an Inference Gateway (llm-d's endpoint picker, SGLang's model gateway)
    pins sessions itself: the key goes in the header it reads."""
    url = await start_proxy(parse({"upstreams": [{"name": "gateway", "urls": [upstream.url], "session_header": "x-session-id"}]}))
    upstream.script(Reply(HI))
    if relayed:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "someone"}
        status, _ = await post_json(http, f"{url}/v1/chat/completions", body)
        expected = "someone"
    else:
        status, _ = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi"}, headers={"x-session-id": "from the client"})
        expected = "from the client"
    assert status == 200
    assert upstream.headers[-1]["x-session-id"] == expected
    status, _ = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi", "prompt_cache_key": "conv"})
    assert upstream.headers[-1]["x-session-id"] == "conv"
    status, _ = await post_json(http, f"{url}/v1/responses", {"model": "m", "input": "hi", "prompt_cache_key": "a\r\nx-evil: 1"})
    assert status == 200 and upstream.headers[-1]["x-session-id"].startswith("key:") and "x-evil" not in upstream.headers[-1]


async def test_chat_calls_of_a_session_stay_on_one_replica(fleet: list[FakeUpstream], start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(fleet_config(fleet))
    for key in ("prompt_cache_key", "user"):
        served = set()
        for i in range(4):
            before = counts(fleet)
            messages = [{"role": "user", "content": f"turn {i}"}]
            status, _ = await post_json(http, f"{url}/v1/chat/completions", {"model": "m", "messages": messages, key: "same"})
            assert status == 200
            served |= {j for j, (a, b) in enumerate(zip(before, counts(fleet), strict=True)) if b > a}
        assert len(served) == 1


@pytest.mark.parametrize("dialect", ["sglang", "vllm", "llama.cpp", "older llama.cpp"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_cached_prompt_tokens_are_reported(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, dialect: str, stream: bool) -> None:
    """design.md 5.2: the upstream's cached prompt tokens (`prompt_tokens_details.cached_tokens`,
    or llama.cpp's `timings.cache_n`) are the usage's `input_tokens_details.cached_tokens`, and
    counted by upstream."""
    older = dialect == "older llama.cpp"
    gen = Generation(HI.steps, completion_tokens=1, prompt_tokens=40, cached_tokens=32, dialect="llama.cpp" if older else dialect, cached_in_usage=not older)  # type: ignore[arg-type]
    upstream.script(Reply(gen))
    url = await start_proxy(parse({"upstreams": [{"name": "one", "urls": [upstream.url]}]}))
    async with http.post(f"{url}/v1/responses", json={"model": "m", "input": "hi", "stream": stream}) as response:
        raw = await response.read()
    if stream:
        completed = [line for line in raw.split(b"\n") if line.startswith(b"data: {") and b'"response.completed"' in line]
        answer = orjson.loads(completed[0][6:])["response"]
    else:
        answer = orjson.loads(raw)
    assert answer["usage"]["input_tokens"] == 40 and answer["usage"]["input_tokens_details"]["cached_tokens"] == 32
    metrics = await scrape(http, url)
    assert sample(metrics, "proxy_cached_prompt_tokens_total", upstream="one") == 32
    assert sample(metrics, "proxy_prompt_tokens_total", upstream="one") == 40


async def test_a_session_map_in_a_redis_that_hangs_costs_a_call_little() -> None:
    """design.md 11.3: a Redis that does not answer within 0.25 s leaves the call routed by its
    hash, and is not asked again for 5 s: the next calls do not wait on it."""
    heard: list[bytes] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):  # reads every command, answers none
            heard.append(data)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0", "test:", 60, 100, 2.0, 100)
    try:
        affinity = backend.affinity("fleet", 60, 300)
        assert await asyncio.wait_for(affinity.get("agent"), 1) is None  # given up within the bound
        asked = len(heard)
        assert asked > 0
        assert await asyncio.wait_for(affinity.get("agent"), 0.05) is None
        await asyncio.wait_for(affinity.set("agent", "http://r1"), 0.05)
        assert len(heard) == asked  # left alone: nothing more was sent
    finally:
        await backend.close()
        server.close()
