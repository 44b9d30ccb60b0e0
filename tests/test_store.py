"""Stored responses (design.md 9) through the real proxy, on both backends: a SQLite file and
a real redis-server. Chains with tool calls, references, GET/DELETE/input_items (as the
openai SDK calls them), isolation between keys, expiry and the size bound."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.config import parse
from tests.client import LOGPROBS, envelope, read_events, validate_response
from tests.events import as_response_logprob
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import post, sample, scrape
from tests.redis_server import RedisServer

WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def proxy_config(upstream: FakeUpstream, store: dict[str, Any], **top: Any) -> Any:
    return parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store, **top})


def tool_call_turn() -> Generation:
    return Generation([
        Step("reasoning", "Need the weather.", [score("Need")]),
        Step("tool", '{"city": "Paris"}', [score("{")], tool_id="call_1", tool_name="weather"),
        Step("finish", finish_reason="tool_calls"),
    ])


def text_turn(text: str) -> Generation:
    return Generation([Step("text", text, [score(text)]), Step("finish", finish_reason="stop", scores=[score("<eos>")])])


async def create(http: aiohttp.ClientSession, url: str, body: dict[str, Any], *, stream: bool, headers: dict | None = None) -> dict:
    """A response, created streamed or not: the final Response object either way."""
    if not stream:
        async with http.post(f"{url}/v1/responses", json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()
    async with http.post(f"{url}/v1/responses", json={**body, "stream": True}, headers=headers) as response:
        assert response.status == 200, await response.text()
        events = [event async for event in read_events(response)]
    return events[-1]["response"]


async def get(http: aiohttp.ClientSession, url: str, path: str, headers: dict | None = None) -> tuple[int, Any]:
    async with http.get(f"{url}/v1/responses/{path}", headers=headers) as response:
        return response.status, await response.json()


@pytest.fixture
async def stored_proxy(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> str:
    return await start_proxy(proxy_config(upstream, store))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_chain_of_turns_with_a_tool_call(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession, stream: bool) -> None:
    url = stored_proxy
    upstream.script(Reply(tool_call_turn()), Reply(text_turn("Sunny.")), Reply(text_turn("You're welcome.")))
    first = await create(http, url, {"model": "m", "instructions": "Be brief.", "input": "Weather in Paris?", "tools": [WEATHER]}, stream=stream)
    assert first["store"] is True and first["previous_response_id"] is None
    call = next(item for item in first["output"] if item["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "21C"}
    second = await create(http, url, {"model": "m", "previous_response_id": first["id"], "input": [output], "tools": [WEATHER]}, stream=stream)
    assert second["previous_response_id"] == first["id"]
    third = await create(http, url, {"model": "m", "previous_response_id": second["id"], "input": "Thanks!"}, stream=stream)
    assert third["output"][0]["content"][0]["text"] == "You're welcome."

    messages = upstream.requests[2]["messages"]
    # The chain oldest first: each response's input, then its output; instructions not carried over.
    assert messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks!"},
    ]
    assert upstream.requests[0]["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_get_returns_the_response_as_it_was_answered(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession, stream: bool) -> None:
    gen = text_turn("Hi")
    upstream.script(Reply(gen))
    answered = await create(http, stored_proxy, {"model": "m", "input": "hi", "include": LOGPROBS, "top_logprobs": 2}, stream=stream)
    status, with_scores = await get(http, stored_proxy, f"{answered['id']}?include[]=message.output_text.logprobs")
    assert status == 200 and with_scores == answered
    validate_response(with_scores)
    scores = with_scores["output"][0]["content"][0]["logprobs"]
    assert scores == [as_response_logprob(s) for step in gen.steps for s in step.scores]
    status, without = await get(http, stored_proxy, answered["id"])
    assert without["output"][0]["content"][0]["logprobs"] == []
    assert {**without, "output": None} == {**answered, "output": None}


async def test_a_streamed_response_is_readable_before_its_last_event_arrives(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(text_turn("Hi")))
    async with http.post(f"{stored_proxy}/v1/responses", json={"model": "m", "input": "hi", "stream": True}) as response:
        async for event in read_events(response):
            if event["type"] == "response.completed":
                status, stored = await get(http, stored_proxy, event["response"]["id"])  # [DONE] not read yet
                assert (status, stored["status"]) == (200, "completed")
                break


@pytest.mark.parametrize("failure", [{"drop_after": 2}, {"error_frame_after": 2}], ids=["dropped", "error-frame"])
async def test_failed_and_incomplete_streams_are_kept_with_their_status(
    upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession, failure: dict
) -> None:
    cut = Generation([Step("text", "Hel", [score("Hel")]), Step("finish", finish_reason="length")])
    upstream.script(Reply(text_turn("Hello"), **failure), Reply(cut))
    for expected in ("failed", "incomplete"):
        answered = await create(http, stored_proxy, {"model": "m", "input": "hi"}, stream=True)
        status, stored = await get(http, stored_proxy, answered["id"])
        assert (status, stored["status"]) == (200, expected)


async def test_store_false_keeps_nothing(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(text_turn("Hi")))
    answered = await create(http, stored_proxy, {"model": "m", "input": "hi", "store": False}, stream=False)
    assert answered["store"] is False
    assert (await get(http, stored_proxy, answered["id"]))[0] == 404
    status, _, raw = await post(http, stored_proxy, {"model": "m", "input": "more", "previous_response_id": answered["id"]})
    assert status == 400 and envelope(orjson.loads(raw), "previous_response_not_found")["param"] == "previous_response_id"


async def test_item_references_resolve_stored_items(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    """What the Vercel AI SDK sends by default: its history as references to earlier items."""
    upstream.script(Reply(tool_call_turn()), Reply(text_turn("Sunny.")))
    first = await create(http, stored_proxy, {"model": "m", "input": [{"role": "user", "content": "Weather?", "id": "msg_mine"}], "tools": [WEATHER]}, stream=True)
    reasoning, call = first["output"][:2]
    # The SDK's ItemReference may leave its type out or null (design.md 9.4).
    refs = [{"type": "item_reference", "id": "msg_mine"}, {"id": reasoning["id"]}, {"type": None, "id": call["id"]}]
    body = {"model": "m", "input": [*refs, {"type": "function_call_output", "call_id": "call_1", "output": "21C"}], "tools": [WEATHER]}
    second = await create(http, stored_proxy, body, stream=True)
    assert [m["role"] for m in upstream.requests[1]["messages"]] == ["user", "assistant", "tool"]
    assert upstream.requests[1]["messages"][1]["reasoning_content"] == "Need the weather."
    # Kept as the items they named: a turn chained on it replays them (and its answer).
    await create(http, stored_proxy, {"model": "m", "input": "Thanks", "previous_response_id": second["id"], "tools": [WEATHER]}, stream=False)
    assert upstream.requests[2]["messages"][:3] == upstream.requests[1]["messages"]
    status, _, raw = await post(http, stored_proxy, {**body, "input": [refs[0], {"type": "item_reference", "id": "msg_nowhere"}]})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "input[1].id"


async def test_a_referenced_item_outlives_the_response_that_referred_to_it(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 9.4: B refers to A's item; deleting B leaves it A's, to refer to again."""
    upstream.script(Reply(text_turn("Hi")))
    a = await create(http, stored_proxy, {"model": "m", "input": "one"}, stream=False)
    reference = {"model": "m", "input": [{"type": "item_reference", "id": a["output"][0]["id"]}]}
    b = await create(http, stored_proxy, reference, stream=False)
    async with http.delete(f"{stored_proxy}/v1/responses/{b['id']}") as response:
        assert response.status == 200
    status, _, raw = await post(http, stored_proxy, reference)
    assert status == 200, raw


async def test_delete_forgets_the_response(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(text_turn("Hi")))
    answered = await create(http, stored_proxy, {"model": "m", "input": "hi"}, stream=False)
    async with http.delete(f"{stored_proxy}/v1/responses/{answered['id']}") as response:
        assert response.status == 200
        assert await response.json() == {"id": answered["id"], "object": "response.deleted", "deleted": True}
    assert (await get(http, stored_proxy, answered["id"]))[0] == 404
    async with http.delete(f"{stored_proxy}/v1/responses/{answered['id']}") as response:
        assert response.status == 404
        envelope(await response.json(), "not_found")
    status, _, raw = await post(http, stored_proxy, {"model": "m", "input": "more", "previous_response_id": answered["id"]})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "previous_response_id"


async def test_a_chain_with_a_link_no_longer_stored_is_a_400(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 9.4: a chain is continued whole or not at all."""
    upstream.script(Reply(text_turn("Hi")))
    first = await create(http, stored_proxy, {"model": "m", "input": "one"}, stream=False)
    second = await create(http, stored_proxy, {"model": "m", "input": "two", "previous_response_id": first["id"]}, stream=False)
    async with http.delete(f"{stored_proxy}/v1/responses/{first['id']}") as response:
        assert response.status == 200
    status, _, raw = await post(http, stored_proxy, {"model": "m", "input": "three", "previous_response_id": second["id"]})
    error = envelope(orjson.loads(raw), "previous_response_not_found")
    assert status == 400 and error["param"] == "previous_response_id" and first["id"] in error["message"]


async def test_input_items_pages(upstream: FakeUpstream, stored_proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(text_turn("ok")))
    # An id null, as the SDK's types allow, is an id left out: the item gets one (design.md 9.3).
    items = [{"role": "user", "content": f"line {i}", **({"id": None} if i % 2 else {})} for i in range(5)]
    answered = await create(http, stored_proxy, {"model": "m", "input": items}, stream=False)
    status, page = await get(http, stored_proxy, f"{answered['id']}/input_items?limit=2")
    assert status == 200 and page["has_more"] is True and page["object"] == "list"
    texts = [item["content"][0]["text"] for item in page["data"]]
    assert texts == ["line 4", "line 3"]  # newest first by default
    _, rest = await get(http, stored_proxy, f"{answered['id']}/input_items?limit=10&after={page['last_id']}")
    assert [item["content"][0]["text"] for item in rest["data"]] == ["line 2", "line 1", "line 0"] and rest["has_more"] is False
    _, ascending = await get(http, stored_proxy, f"{answered['id']}/input_items?order=asc&before={page['first_id']}")
    assert [item["content"][0]["text"] for item in ascending["data"]] == ["line 0", "line 1", "line 2", "line 3"]
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=nope", "after")):
        status, body = await get(http, stored_proxy, f"{answered['id']}/input_items?{query}")
        assert status == 400 and envelope(body)["param"] == param


async def test_the_openai_sdk_reads_and_deletes(upstream: FakeUpstream, stored_proxy: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stored_proxy}/v1", api_key="unused", max_retries=0)
    upstream.script(Reply(tool_call_turn()))
    created = await client.responses.create(model="m", input="Weather?", tools=[WEATHER], include=["message.output_text.logprobs"])
    retrieved = await client.responses.retrieve(created.id, include=["message.output_text.logprobs"])
    assert retrieved.model_dump() == created.model_dump()
    listed = [item async for item in client.responses.input_items.list(created.id)]
    assert [(item.type, item.role) for item in listed] == [("message", "user")]
    assert listed[0].content[0].text == "Weather?"
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    await client.close()


async def test_a_response_belongs_to_its_key(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    url = await start_proxy(proxy_config(upstream, store, auth={"api_keys": ["key-a", "key-b"]}))
    a, b = ({"Authorization": f"Bearer key-{k}"} for k in "ab")
    upstream.script(Reply(tool_call_turn()))
    answered = await create(http, url, {"model": "m", "input": "hi", "tools": [WEATHER]}, stream=False, headers=a)
    assert (await get(http, url, answered["id"], a))[0] == 200
    for path in (answered["id"], f"{answered['id']}/input_items"):
        assert (await get(http, url, path, b))[0] == 404
    async with http.delete(f"{url}/v1/responses/{answered['id']}", headers=b) as response:
        assert response.status == 404
    for body, param in (
        ({"previous_response_id": answered["id"], "input": "more"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": answered["output"][0]["id"]}]}, "input[0].id"),
    ):
        async with http.post(f"{url}/v1/responses", json={"model": "m", **body}, headers=b) as response:
            assert response.status == 400
            assert envelope(await response.json())["param"] == param
    assert (await get(http, url, answered["id"], a))[0] == 200  # b's attempts changed nothing


async def test_records_expire(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    url = await start_proxy(proxy_config(upstream, {**store, "ttl": 1}))
    upstream.script(Reply(text_turn("Hi")))
    answered = await create(http, url, {"model": "m", "input": "hi"}, stream=False)
    assert (await get(http, url, answered["id"]))[0] == 200
    await asyncio.sleep(2.1)
    assert (await get(http, url, answered["id"]))[0] == 404


async def test_the_oldest_go_past_the_size_bound(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    url = await start_proxy(proxy_config(upstream, {**store, "max_responses": 5}))
    upstream.script(Reply(text_turn("Hi")))
    ids = [(await create(http, url, {"model": "m", "input": f"n{i}"}, stream=False))["id"] for i in range(66)]
    kept = [id for id in ids if (await get(http, url, id))[0] == 200]
    assert ids[-1] in kept and len(kept) <= 6  # SQLite: one sweep every 64 writes, at most one past it
    if not store["url"].startswith("sqlite:"):  # Redis: each put keeps its owner's bound (design.md 9.1)
        assert len(kept) == 5


async def test_the_bound_is_each_keys(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """design.md 9.1: `max_responses` bounds each key's: a key's flood drops its own oldest,
    never another key's, however much older those are (65 writes: SQLite sweeps at the last)."""
    url = await start_proxy(proxy_config(upstream, {**store, "max_responses": 5}, auth={"api_keys": ["key-a", "key-b"]}))
    upstream.script(Reply(text_turn("Hi")))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    quiet = [(await create(http, url, {"model": "m", "input": f"b{i}"}, stream=False, headers=b))["id"] for i in range(2)]
    flood = [(await create(http, url, {"model": "m", "input": f"a{i}"}, stream=False, headers=a))["id"] for i in range(63)]
    assert [(await get(http, url, id, headers=b))[0] for id in quiet] == [200, 200]
    kept = [id for id in flood if (await get(http, url, id, headers=a))[0] == 200]
    assert len(kept) == 5 and flood[-1] in kept


async def test_without_a_store_nothing_is_kept_or_continued(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(proxy_config(upstream, {"url": "none"}))
    upstream.script(Reply(text_turn("Hi")))
    answered = await create(http, url, {"model": "m", "input": "hi"}, stream=False)
    assert answered["store"] is False
    assert (await get(http, url, answered["id"]))[0] == 404
    for body, param in (({"previous_response_id": "resp_1", "input": "x"}, "previous_response_id"), ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input")):
        status, _, raw = await post(http, url, {"model": "m", **body})
        assert status == 400 and envelope(orjson.loads(raw))["param"] == param


async def test_a_store_that_goes_down_costs_no_answer(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path) -> None:
    """Redis stopped mid-run: answers still stream, the failures are counted and shown on /ready,
    and once it is back responses are kept again."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        url = await start_proxy(proxy_config(upstream, {"url": server.url, "timeout": 0.5}))
        upstream.script(Reply(text_turn("Hi")))
        kept = await create(http, url, {"model": "m", "input": "hi"}, stream=True)
        server.stop()
        for stream in (True, False):
            lost = await create(http, url, {"model": "m", "input": "hi"}, stream=stream)
            assert lost["status"] == "completed" and lost["output"][0]["content"][0]["text"] == "Hi"
        async with http.get(f"{url}/ready") as response:
            ready = await response.json()
            assert response.status == 200 and ready["ready"] is True
            assert ready["store"]["ok"] is False and ready["store"]["error"].startswith("put")
        status, body = await get(http, url, kept["id"])
        assert status == 503 and envelope(body, "store_unavailable")
        status, _, _ = await post(http, url, {"model": "m", "input": "x", "previous_response_id": kept["id"]})
        assert status == 503
        assert sample(await scrape(http, url), "proxy_store_errors_total", operation="put") == 2
        server.start()  # back, empty
        again = await create(http, url, {"model": "m", "input": "hi"}, stream=True)
        assert (await get(http, url, again["id"]))[0] == 200
        async with http.get(f"{url}/ready") as response:
            assert (await response.json())["store"]["ok"] is True
    finally:
        server.stop()


async def test_a_store_that_hangs_fails_reads_in_time_and_leaves_no_reply_behind(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path) -> None:
    """Redis stops answering with its connections open: a read fails within `store.timeout`
    (a 503), and once it answers again, the replies to the commands given up on, which it then
    sends, reach no later command."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        url = await start_proxy(proxy_config(upstream, {"url": server.url, "timeout": 0.5}))
        upstream.script(Reply(text_turn("One")), Reply(text_turn("Two")))
        kept = [await create(http, url, {"model": "m", "input": "hi"}, stream=False) for _ in range(2)]
        server.pause()
        try:
            for response in kept:
                started = time.monotonic()
                status, body = await get(http, url, response["id"])
                assert status == 503 and envelope(body, "store_unavailable")
                assert time.monotonic() - started < 2.0
        finally:
            server.resume()
        for response in [*kept, *reversed(kept)] * 2:
            status, body = await get(http, url, response["id"])
            assert status == 200 and body["id"] == response["id"]
            assert body["output"][0]["content"][0]["text"] == response["output"][0]["content"][0]["text"]
    finally:
        server.stop()


async def test_the_list_of_a_keys_responses_newest_first(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """GET /v1/responses, an extension (design.md 9.3): the key's own, newest first, paged; a
    deleted one is gone from it; scores only with `include`."""
    url = await start_proxy(proxy_config(upstream, store, auth={"api_keys": ["key-a", "key-b"]}))
    a, b = ({"Authorization": f"Bearer key-{k}"} for k in "ab")
    upstream.script(Reply(text_turn("Hi")))
    created = [await create(http, url, {"model": "m", "input": f"q{i}", "include": LOGPROBS}, stream=False, headers=a) for i in range(3)]
    # Newest first: by creation (whole seconds, as the API has it), then by id.
    made = [r["id"] for r in sorted(created, key=lambda r: (r["created_at"], r["id"]))]
    await create(http, url, {"model": "m", "input": "theirs"}, stream=False, headers=b)

    async def page(headers: dict, query: str = "") -> tuple[int, Any]:
        async with http.get(f"{url}/v1/responses{query}", headers=headers) as response:
            return response.status, await response.json()

    status, first = await page(a, "?limit=2")
    assert status == 200 and first["object"] == "list"
    assert [r["id"] for r in first["data"]] == made[:0:-1] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (made[2], made[1])
    assert first["data"][0]["output"][0]["content"][0]["logprobs"] == []  # asked for with include
    _, rest = await page(a, f"?limit=2&after={first['last_id']}&include[]=message.output_text.logprobs")
    assert [r["id"] for r in rest["data"]] == [made[0]] and rest["has_more"] is False
    assert rest["data"][0]["output"][0]["content"][0]["logprobs"] != []
    async with http.delete(f"{url}/v1/responses/{made[1]}", headers=a):
        pass
    assert [r["id"] for r in (await page(a))[1]["data"]] == [made[2], made[0]]
    assert [r["output"][0]["content"][0]["text"] for r in (await page(b))[1]["data"]] == ["Hi"]
    for query, param in (("?after=resp_unknown", "after"), (f"?after={made[0]}&limit=0", "limit")):
        status, refused = await page(a, query)
        assert status == 400 and envelope(refused)["param"] == param
    assert (await page(b, f"?after={made[0]}"))[0] == 400  # another key's response is no cursor


async def test_the_redis_list_pages_past_records_gone_and_its_indexes_forget_them(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    """A record that expired (here: deleted under the proxy, as Redis expires it) leaves its id
    in the owner's index until met: a page still holds `limit` responses and says whether more
    remain; a put drops from its owner's index the ids older than records live."""
    import redis.asyncio as aioredis

    prefix = f"test-{time.time_ns()}:"
    url = await start_proxy(proxy_config(upstream, {"url": redis_server.url, "prefix": prefix, "ttl": 2}))
    upstream.script(Reply(text_turn("Hi")))
    made = [(await create(http, url, {"model": "m", "input": f"q{i}"}, stream=False))["id"] for i in range(4)]
    async with http.get(f"{url}/v1/responses?limit=100") as whole:
        listed = [r["id"] for r in (await whole.json())["data"]]
    assert sorted(listed) == sorted(made)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        await client.delete(f"{prefix}response:{listed[1]}")
        async with http.get(f"{url}/v1/responses?limit=2") as page:
            first = await page.json()
        assert [r["id"] for r in first["data"]] == [listed[0], listed[2]] and first["has_more"] is True
        await asyncio.sleep(3.1)  # every record expired: a new one's put drops them from its owner's index
        await create(http, url, {"model": "m", "input": "later"}, stream=False)
        assert await client.zcard(f"{prefix}owned:") == 1
    finally:
        await client.aclose()
