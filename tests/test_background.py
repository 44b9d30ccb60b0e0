"""Background responses (design.md 10) on both store backends: polling to the end, a stream
cut and resumed on another replica, cancel, the caps, and the openai SDK's calls. (A replica
killed mid-run: tests/test_process.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import openai
import orjson
import pytest

from proxy.config import parse
from proxy.errors import StoreUnavailable
from proxy.metrics import Metrics
from proxy.runtime import open_store
from proxy.store import Fenced, ResponseStore, Runs, StoredResponse
from tests.client import LOGPROBS, envelope, eventually, parse_sse, read_events, validate_response
from tests.events import sent_scores
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import BODY, post
from tests.redis_server import RedisServer, command_calls

WORDS = [f"w{i} " for i in range(30)]


def slow_text(n: int = 30) -> Generation:
    return Generation([*(Step("text", w, [score(w)]) for w in WORDS[:n]), Step("finish", finish_reason="stop", scores=[score("<eos>")])])


def replica_config(upstream: FakeUpstream, store: dict[str, Any], **top: Any) -> Any:
    return parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store, **top})


@pytest.fixture
async def replicas(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> tuple[str, str]:
    """Two proxies over one store (one SQLite file, or one Redis): two replicas."""
    config = replica_config(upstream, store, background={"lease": 1.0, "snapshot_interval": 0.05})
    return await start_proxy(config), await start_proxy(config)


async def get(http: aiohttp.ClientSession, url: str, id: str) -> dict[str, Any]:
    async with http.get(f"{url}/v1/responses/{id}?include[]=message.output_text.logprobs") as response:
        assert response.status == 200, await response.text()
        return dict(await response.json())


async def _found(http: aiohttp.ClientSession, url: str, id: str) -> bool:
    async with http.get(f"{url}/v1/responses/{id}") as response:
        return response.status != 404


async def until_done(http: aiohttp.ClientSession, url: str, id: str, timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while (response := await get(http, url, id))["status"] in ("queued", "in_progress"):
            await asyncio.sleep(0.05)
    return response


async def replay(http: aiohttp.ClientSession, url: str, id: str, after: int = -1) -> bytes:
    async with http.get(f"{url}/v1/responses/{id}?stream=true&starting_after={after}") as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def test_queued_at_once_then_polled_to_the_end(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    one, other = replicas
    gen = slow_text()
    upstream.script(Reply(gen, delay=0.02))
    status, _, raw = await post(http, one, {**BODY, "include": LOGPROBS, "background": True})
    queued = orjson.loads(raw)
    assert status == 200 and (queued["status"], queued["background"], queued["output"]) == ("queued", True, [])
    validate_response(queued)
    seen = set()
    partial = 0  # snapshots read with some output: the checks below must have run
    sent = sent_scores(gen.chunks())
    async with asyncio.timeout(10):
        while (now := await get(http, other, queued["id"]))["status"] != "completed":
            seen.add(now["status"])
            if now["output"]:  # as it stands: the text so far and its scores so far (with the
                # finish chunk's score once that came, before the response is completed)
                partial += 1
                part = now["output"][0]["content"][0]
                assert "".join(WORDS).startswith(part["text"]) and part["logprobs"] == sent[: len(part["logprobs"])]
                assert len(part["text"].split()) <= len(part["logprobs"]) <= len(part["text"].split()) + 1
            await asyncio.sleep(0.05)
    assert "in_progress" in seen and partial
    validate_response(now)
    assert now["output"][0]["content"][0]["text"] == "".join(WORDS)
    assert now["output"][0]["content"][0]["logprobs"] == sent
    assert now["usage"]["output_tokens"] == gen.usage()["completion_tokens"]


async def test_a_cut_stream_resumes_on_the_other_replica_event_for_event(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    one, other = replicas
    gen = slow_text()
    upstream.script(Reply(gen, delay=0.02))
    cut_at = random.randrange(3, 25)
    seen: list[dict[str, Any]] = []
    async with http.post(f"{one}/v1/responses", json={**BODY, "include": LOGPROBS, "background": True, "stream": True}) as response:
        async for event in read_events(response):
            seen.append(event)
            if event["sequence_number"] == cut_at:
                break
        response.close()
    assert seen[0]["type"] == "response.created" and seen[0]["response"]["status"] == "queued"  # design.md 10.1
    assert upstream.disconnects == 0  # the client left; the generation goes on
    id = seen[0]["response"]["id"]
    resumed = await replay(http, other, id, after=cut_at)  # the rest, followed to the end
    whole = await replay(http, one, id)  # the log from its start, once it ended
    assert seen + parse_sse(resumed) == parse_sse(whole)  # every event once, in order
    assert whole.endswith(resumed)  # byte for byte what was first written
    final = parse_sse(whole)[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["logprobs"] == sent_scores(gen.chunks())


async def test_cancel_from_the_other_replica(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    one, other = replicas
    upstream.script(Reply(slow_text(), stall_after=6))
    _, _, raw = await post(http, one, {**BODY, "include": LOGPROBS, "background": True})
    id = orjson.loads(raw)["id"]
    await eventually(lambda: upstream.active_streams == 1, 5)
    async with http.post(f"{other}/v1/responses/{id}/cancel") as response:
        assert response.status == 200, await response.text()
        cancelled = await response.json()
    assert cancelled["status"] == "cancelled"
    validate_response(cancelled)
    await asyncio.wait_for(upstream.disconnected.wait(), 3)  # the generation stopped
    message = cancelled["output"][0]
    assert message["status"] == "incomplete" and message["content"][0]["text"] == "".join(WORDS[:5])  # the role chunk, then five words
    events = parse_sse(await replay(http, other, id))
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "cancelled"
    # Again: the same answer. Finished or synchronous: refused, as OpenAI does.
    async with http.post(f"{one}/v1/responses/{id}/cancel") as response:
        assert response.status == 200 and (await response.json())["status"] == "cancelled"
    upstream.script(Reply(slow_text(3)))
    for body in ({**BODY, "background": True}, BODY):
        _, _, raw = await post(http, one, body)
        done = await until_done(http, one, orjson.loads(raw)["id"])
        async with http.post(f"{one}/v1/responses/{done['id']}/cancel") as response:
            assert response.status == 400
            message = envelope(await response.json())["message"]
            assert message == ("Cannot cancel a response that is already completed." if done["background"] else "Cannot cancel a synchronous response.")


async def test_caps_on_running_responses(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> None:
    config = replica_config(upstream, store, background={"max_running": 3, "max_running_per_key": 2}, auth={"api_keys": ["sk-a", "sk-b"]})
    url = await start_proxy(config)
    upstream.script(Reply(slow_text(), stall_after=3))
    sessions = {key: aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) for key in ("sk-a", "sk-b")}
    try:
        answers = [await post(sessions[key], url, {**BODY, "background": True}) for key in ("sk-a", "sk-a", "sk-a", "sk-b", "sk-b")]
        assert [status for status, _, _ in answers] == [200, 200, 429, 200, 429]  # a key's cap, then the cap of all
        assert envelope(orjson.loads(answers[2][2]), "rate_limit_exceeded")
        async with sessions["sk-a"].post(f"{url}/v1/responses/{orjson.loads(answers[0][2])['id']}/cancel") as response:
            assert response.status == 200
        status, _, _ = await post(sessions["sk-b"], url, {**BODY, "background": True})
        assert status == 200  # a place came free
    finally:
        for session in sessions.values():
            await session.close()


async def test_without_keys_only_the_cap_of_all_counts(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """With no API keys every request is nobody's: a key's cap would be the cap of all."""
    url = await start_proxy(replica_config(upstream, store, background={"max_running": 3, "max_running_per_key": 1}))
    upstream.script(Reply(slow_text(), stall_after=3))
    answers = [await post(http, url, {**BODY, "background": True}) for _ in range(4)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429]
    assert "key" not in envelope(orjson.loads(answers[3][2]), "rate_limit_exceeded")["message"]


async def test_the_cap_of_all_keys_together(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> None:
    """`max_running` counts every key's runs: a key under its own cap is refused once all the
    keys together reach it (design.md 10.5)."""
    config = replica_config(upstream, store, background={"max_running": 2, "max_running_per_key": 2}, auth={"api_keys": ["sk-a", "sk-b"]})
    url = await start_proxy(config)
    upstream.script(Reply(slow_text(), stall_after=3))
    statuses = []
    for key in ("sk-a", "sk-a", "sk-b"):
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            status, _, raw = await post(http, url, {**BODY, "background": True})
            statuses.append(status)
    assert statuses == [200, 200, 429] and envelope(orjson.loads(raw), "rate_limit_exceeded")


async def test_requests_that_arrive_together_cannot_pass_a_cap(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """The caps are counted and the lease taken in one step (design.md 10.5): of ten requests
    sent at once to two replicas, as many run as the cap allows."""
    config = replica_config(upstream, store, background={"max_running": 3, "max_running_per_key": 3})
    urls = [await start_proxy(config), await start_proxy(config)]
    upstream.script(Reply(slow_text(), stall_after=3))
    answers = await asyncio.gather(*(post(http, urls[i % 2], {**BODY, "background": True}) for i in range(10)))
    assert sorted(status for status, _, _ in answers) == [200] * 3 + [429] * 7


async def test_input_items_keep_their_ids_while_a_response_runs(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    """Items sent without ids get them once: the snapshots of a running response and its final
    record list the same items under the same ids (design.md 9.3, 10.2)."""
    one, other = replicas
    upstream.script(Reply(slow_text(), delay=0.02))
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    _, _, raw = await post(http, one, {**BODY, "input": messages, "background": True})
    id = orjson.loads(raw)["id"]

    async def item_ids() -> list[str]:
        async with http.get(f"{other}/v1/responses/{id}/input_items?order=asc") as response:
            assert response.status == 200, await response.text()
            return [item["id"] for item in (await response.json())["data"]]

    seen = [await item_ids()]
    async with asyncio.timeout(10):
        while (await get(http, other, id))["status"] != "completed":
            seen.append(await item_ids())
            await asyncio.sleep(0.05)
    seen.append(await item_ids())
    assert len(seen) > 3 and len(seen[0]) == 2 and all(ids == seen[0] for ids in seen)


async def test_a_run_that_ends_while_the_store_is_down_is_kept_when_it_is_back(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path: Any
) -> None:
    """The events and the final response the store could not take are kept once it is back
    (within a lease), so that a reader sees the run end (design.md 10.2)."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        config = replica_config(upstream, {"url": server.url, "timeout": 0.3}, background={"lease": 3.0})
        url = await start_proxy(config)
        gen = slow_text()
        upstream.script(Reply(gen, delay=0.02))
        _, _, raw = await post(http, url, {**BODY, "include": LOGPROBS, "background": True})
        id = orjson.loads(raw)["id"]
        server.pause()  # it answers nothing, as a store cut off by the network
        try:
            await eventually(lambda: upstream.active_streams == 1, 5)  # it streams, then ends with the store away
            await eventually(lambda: upstream.active_streams == 0, 5)
        finally:
            server.resume()
        # The run tries again every quarter lease, its lease still its own (design.md 10.4).
        final = await until_done(http, url, id)
        assert final["status"] == "completed" and final["output"][0]["content"][0]["logprobs"] == sent_scores(gen.chunks())
        assert parse_sse(await replay(http, url, id))[-1]["type"] == "response.completed"
    finally:
        server.stop()


async def test_the_items_of_a_running_response_can_be_referred_to_once_it_ends(
    upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession
) -> None:
    """A running response is kept again at every snapshot, with all it made so far; its items
    are kept for `item_reference` once it ends (design.md 10.2)."""
    one, other = replicas
    upstream.script(Reply(slow_text(), stall_after=3), Reply(slow_text(2)))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    async with asyncio.timeout(5):
        while not (running := await get(http, other, id))["output"]:
            await asyncio.sleep(0.05)
    reference = {**BODY, "input": [{"type": "item_reference", "id": running["output"][0]["id"]}]}
    status, _, raw = await post(http, other, reference)
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "input[0].id"
    async with http.post(f"{other}/v1/responses/{id}/cancel") as response:
        assert response.status == 200
    status, _, raw = await post(http, other, reference)
    assert status == 200, raw


async def test_delete_forgets_a_background_response_with_its_events(
    upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    one, other = replicas
    upstream.script(Reply(slow_text(3)))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    await until_done(http, other, id)
    kept = open_store(replica_config(upstream, store).store, Metrics())
    assert kept is not None
    try:
        assert await kept.events(id, -1, 0)  # its log, before
        async with http.delete(f"{other}/v1/responses/{id}") as response:
            assert response.status == 200
        assert await kept.events(id, -1, 0) == []
    finally:
        await kept.close()


async def test_a_follower_past_the_end_gets_done_at_once(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    """design.md 10.2: a client that saw the terminal event (and lost `[DONE]`) resumes from it."""
    one, other = replicas
    upstream.script(Reply(slow_text(3)))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    await until_done(http, one, id)
    whole = parse_sse(await replay(http, other, id))
    last = whole[-1]["sequence_number"]
    async with asyncio.timeout(2):  # a keep-alive interval is 15 s
        for after in (last, last + 5):
            assert await replay(http, other, id, after=after) == b"data: [DONE]\n\n"
        assert parse_sse(await replay(http, one, id, after=last - 1)) == whole[-1:]


async def test_a_starting_after_that_is_no_sequence_number_is_refused_before_the_stream(
    upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession
) -> None:
    """design.md 10.2: a 400 naming the field, not a stream cut by a store that cannot read
    the number."""
    one, _ = replicas
    upstream.script(Reply(slow_text(3)))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    for after in (-2, 2**63, "x"):  # just past what the stores hold (-1 to 2**63 - 1), and no number
        async with http.get(f"{one}/v1/responses/{id}?stream=true&starting_after={after}") as response:
            assert response.status == 400 and envelope(await response.json())["param"] == "starting_after", after
    await until_done(http, one, id)
    async with asyncio.timeout(2):
        assert await replay(http, one, id, after=2**63 - 1) == b"data: [DONE]\n\n"


async def test_a_follower_past_the_end_of_a_running_response_ends_with_it(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """design.md 10.2: it waits for events above its number; the response ends below it, and
    the stream ends with `[DONE]` within a keep-alive interval."""
    url = await start_proxy(replica_config(upstream, store, keepalive=0.2))
    upstream.script(Reply(slow_text(5), delay=0.1))
    _, _, raw = await post(http, url, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    async with asyncio.timeout(5), http.get(f"{url}/v1/responses/{id}?stream=true&starting_after=1000") as response:
        assert response.status == 200
        body = await response.read()
    assert (await get(http, url, id))["status"] == "completed"
    assert body.replace(b": keepalive\n\n", b"") == b"data: [DONE]\n\n"


async def test_a_store_that_fails_under_a_follower_cuts_its_stream(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """design.md 5.9: once the stream has begun, a store error cuts the connection (the client
    resumes from the last event it saw), never a 503 written into the stream's body; the
    error is logged with the request's id."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        url = await start_proxy(replica_config(upstream, {"url": server.url, "timeout": 0.3}, keepalive=0.2, background={"lease": 3.0}))
        upstream.script(Reply(slow_text(), stall_after=3))
        _, _, raw = await post(http, url, {**BODY, "background": True})
        id = orjson.loads(raw)["id"]
        async with asyncio.timeout(10), http.get(f"{url}/v1/responses/{id}?stream=true") as response:
            assert response.status == 200
            data = await response.content.readuntil(b"\n\n")
            server.stop()
            with pytest.raises(aiohttp.ClientPayloadError):
                while piece := await response.content.readany():
                    data += piece
        assert b"HTTP/1.1" not in data and b"store_unavailable" not in data
        assert data.startswith(b"event: response.created\n")
        cuts = [record for record in caplog.records if "the stream is cut short" in record.getMessage()]
        assert cuts and all(getattr(record, "request_id", "") for record in cuts)
    finally:
        server.stop()


async def test_a_resumed_stream_reads_what_was_kept_once(
    upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first read starts at the event the client saw, to learn whether the response ended
    there, and hands on the rest: one read of the store for a response that has ended."""
    one, other = replicas
    upstream.script(Reply(slow_text(5)))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    await until_done(http, one, id)
    whole = parse_sse(await replay(http, other, id))
    reads = []
    events = ResponseStore.events

    async def counted(store: ResponseStore, *args: Any) -> list[tuple[int, bytes]]:
        reads.append(args)
        return await events(store, *args)

    monkeypatch.setattr(ResponseStore, "events", counted)
    assert parse_sse(await replay(http, other, id, after=3)) == whole[4:]
    assert len(reads) == 1, reads


async def test_delete_stops_a_running_response_for_good(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    """design.md 9.3: a running response is cancelled before it is forgotten; else its run would
    keep it again, and its generation would go on."""
    one, other = replicas
    upstream.script(Reply(slow_text(), stall_after=6))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    await eventually(lambda: upstream.active_streams == 1, 5)
    async with http.delete(f"{other}/v1/responses/{id}") as response:
        assert response.status == 200, await response.text()
    await asyncio.wait_for(upstream.disconnected.wait(), 3)  # the generation stopped
    await asyncio.sleep(1.5)  # past a lease: anything the run still had to keep is kept by now
    assert not await _found(http, one, id) and not await _found(http, other, id)
    kept = open_store(replica_config(upstream, store).store, Metrics())
    assert kept is not None
    try:
        assert await kept.events(id, -1, 0) == []
    finally:
        await kept.close()


async def test_a_running_response_is_continued_only_once_it_ended(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    """What a running response made so far is a turn cut short, which its end would replace."""
    one, other = replicas
    upstream.script(Reply(slow_text(), delay=0.02))
    _, _, raw = await post(http, one, {**BODY, "background": True})
    id = orjson.loads(raw)["id"]
    status, _, raw = await post(http, other, {**BODY, "previous_response_id": id})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "previous_response_id"
    await until_done(http, one, id)
    upstream.script(Reply(slow_text(2)))
    status, _, raw = await post(http, other, {**BODY, "previous_response_id": id})
    assert status == 200, raw
    assert "".join(WORDS) in str(upstream.requests[-1]["messages"])


async def test_cancels_that_come_together_end_the_response_cancelled(upstream: FakeUpstream, replicas: tuple[str, str], http: aiohttp.ClientSession) -> None:
    """A second cancel of a run that is writing its end must not cut that writing short (it was
    left unkept, and 10.4 then ended the response failed)."""
    one, _ = replicas
    upstream.choose = lambda body: Reply(slow_text(), headers_delay=1.0)
    ids = []
    for _ in range(20):
        _, _, raw = await post(http, one, {**BODY, "background": True})
        ids.append(orjson.loads(raw)["id"])

        async def cancel(id: str = ids[-1]) -> str:
            async with http.post(f"{one}/v1/responses/{id}/cancel") as response:
                return str((await response.json())["status"])

        assert set(await asyncio.gather(*(cancel() for _ in range(8)))) == {"cancelled"}
    await asyncio.sleep(1.6)  # past a lease and a half: a run left unkept would be failed by now
    assert [(await get(http, one, id))["status"] for id in ids] == ["cancelled"] * len(ids)


async def test_background_needs_a_store_and_stores(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, store: dict[str, Any]) -> None:
    without = await start_proxy(replica_config(upstream, {"url": "none"}))
    status, _, raw = await post(http, without, {**BODY, "background": True})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "background"
    url = await start_proxy(replica_config(upstream, store))
    status, _, raw = await post(http, url, {**BODY, "background": True, "store": False})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "store"
    upstream.script(Reply(slow_text(2)))
    _, _, raw = await post(http, url, BODY)
    async with http.get(f"{url}/v1/responses/{orjson.loads(raw)['id']}?stream=true") as response:
        assert response.status == 400 and envelope(await response.json())["param"] == "stream"


async def test_the_openai_sdk_runs_reads_follows_and_cancels(upstream: FakeUpstream, replicas: tuple[str, str]) -> None:
    clients = [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) for url in replicas]
    try:
        upstream.script(Reply(slow_text(), delay=0.02))
        created = await clients[0].responses.create(model="m", input="hi", background=True, include=["message.output_text.logprobs"])
        assert created.status == "queued" and created.background
        events = [event async for event in await clients[1].responses.retrieve(created.id, stream=True, starting_after=5)]
        assert events[0].sequence_number == 6 and events[-1].type == "response.completed"
        done = await clients[1].responses.retrieve(created.id)
        assert done.status == "completed" and done.output_text == "".join(WORDS)
        upstream.script(Reply(slow_text(), stall_after=4))
        running = await clients[1].responses.create(model="m", input="hi", background=True)
        await eventually(lambda: upstream.active_streams == 1, 5)
        cancelled = await clients[0].responses.cancel(running.id)
        assert cancelled.status == "cancelled"
    finally:
        for client in clients:
            await client.close()


async def test_a_stream_followed_where_it_runs_needs_no_poll(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite cannot wake a reader in another process, so such a reader polls; a reader in the
    process that runs the response is woken by each append. With a poll of a minute, a
    stream of 30 events still ends at once."""
    monkeypatch.setattr("proxy.store.POLL", 60.0)
    url = await start_proxy(replica_config(upstream, {"url": f"sqlite:{tmp_path}/responses.db"}))
    gen = slow_text()
    upstream.script(Reply(gen, delay=0.01))
    async with asyncio.timeout(10), http.post(f"{url}/v1/responses", json={**BODY, "include": LOGPROBS, "background": True, "stream": True}) as response:
        events = parse_sse(await response.read())
    assert events[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "".join(WORDS)


@contextlib.asynccontextmanager
async def replicas_of(settings: Any, count: int = 2) -> AsyncIterator[list[ResponseStore]]:
    """`count` stores over one SQLite file or one Redis, as that many replicas open them."""
    stores = [open_store(settings, Metrics()) for _ in range(count)]
    try:
        assert all(store is not None for store in stores)
        yield [store for store in stores if store is not None]
    finally:
        for store in stores:
            if store is not None:
                await store.close()


class StoreReads:
    """How often a backend's events were read, as the backend itself counts: SQLite's
    statements, Redis's own command statistics."""

    def __init__(self, kept: ResponseStore, store: dict[str, Any]) -> None:
        self._sqlite: list[str] = []
        self._redis = None if store["url"].startswith("sqlite:") else store["url"]
        if self._redis is None:
            kept.backend._connection().set_trace_callback(self._sqlite.append)  # type: ignore[attr-defined]

    async def count(self) -> int:
        if self._redis is None:
            return sum(statement.startswith("SELECT seq, event") and " AND seq > " in statement for statement in self._sqlite)
        calls = command_calls(self._redis)
        return calls["xread"] + calls["xrange"]


async def test_a_follower_where_the_run_is_kept_is_handed_its_events_unread(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """design.md 10.2: a follower in the process that keeps a run's events takes each batch as
    it is kept, without reading the backend, even one that read an event of the backend before
    the process saw its append end; one behind the last batch reads the backend; one caught up
    still gets, within a poll interval, what another replica kept after a takeover."""
    async with replicas_of(replica_config(upstream, store).store) as (here, there):
        reads = StoreReads(here, store)
        await here.claim("resp_1", "owner", "token", 10.0, Runs(10, 10))
        await here.append("resp_1", [(0, b"event 0"), (1, b"event 1")], "token")
        before = await reads.count()
        follower = asyncio.create_task(here.events("resp_1", 1, 5))
        await asyncio.sleep(0.01)
        await here.append("resp_1", [(2, b"event 2")], "token")
        assert await follower == [(2, b"event 2")]
        await there.append("resp_1", [(3, b"event 3")], "token")  # as if read before here saw it kept
        follower = asyncio.create_task(here.events("resp_1", 3, 5))
        await asyncio.sleep(0.01)
        await here.append("resp_1", [(4, b"event 4")], "token")
        assert await follower == [(4, b"event 4")]
        assert await reads.count() == before
        assert await here.events("resp_1", 2, 5) == [(3, b"event 3"), (4, b"event 4")]  # behind the last batch
        assert await reads.count() > before
        follower = asyncio.create_task(here.events("resp_1", 4, 5))
        await asyncio.sleep(0.01)
        await there.append("resp_1", [(5, b"event 5 from a takeover")], "token")
        async with asyncio.timeout(1):
            assert await follower == [(5, b"event 5 from a takeover")]


async def test_sqlite_takes_the_appends_of_one_loop_turn_in_one_transaction(upstream: FakeUpstream, tmp_path) -> None:
    """design.md 10.2: the appends of every run made in one turn of the event loop (an SGLang
    decode step reaches all its streams at once) share one SQLite transaction."""
    async with replicas_of(replica_config(upstream, {"url": f"sqlite:{tmp_path}/responses.db"}).store) as (here, there):
        statements: list[str] = []
        for i in range(8):
            await here.claim(f"resp_{i}", "owner", "token", 10.0, Runs(10, 10))
        here.backend._connection().set_trace_callback(statements.append)  # type: ignore[attr-defined]
        await there.append("resp_7", [(0, b"kept first")], "token")
        answers = await asyncio.gather(*(here.append(f"resp_{i}", [(0, f"event of {i}".encode())], "token") for i in range(8)), return_exceptions=True)
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert answers[:7] == [None] * 7 and isinstance(answers[7], StoreUnavailable)  # a clash refuses its own batch only
        for i in range(7):
            assert await there.events(f"resp_{i}", -1, 0) == [(0, f"event of {i}".encode())]
        assert await there.events("resp_7", -1, 0) == [(0, b"kept first")]


async def test_replicas_opening_a_new_sqlite_file_at_once_all_work(upstream: FakeUpstream, tmp_path) -> None:
    """design.md 9.1: replicas that open a new SQLite file at the same moment wait for whichever
    sets its WAL mode (a lock SQLite's busy timeout does not wait for), instead of failing
    their first operation. Twenty new files, four replicas each."""
    for trial in range(20):
        async with replicas_of(replica_config(upstream, {"url": f"sqlite:{tmp_path}/{trial}.db"}).store, 4) as stores:
            await asyncio.gather(*(store.claim(f"resp_{i}", "", "token", 10.0, Runs(10, 10)) for i, store in enumerate(stores)))
            await asyncio.gather(*(store.append(f"resp_{i}", [(0, b"event 0")], "token") for i, store in enumerate(stores)))


async def test_a_batch_sent_again_is_kept_once_and_a_clash_is_refused(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """design.md 10.2: a batch whose answer was lost (a store timeout after the write) waits in
    the run and goes again with the next events; the store keeps each event once. A batch that
    holds an event kept already with other bytes (another replica took the run over) is
    refused whole, and what was kept stays."""
    async with replicas_of(replica_config(upstream, store).store) as (here, there):
        await here.claim("resp_1", "owner", "token", 10.0, Runs(10, 10))
        await here.append("resp_1", [(0, b"event 0"), (1, b"event 1")], "token")
        await here.append("resp_1", [(0, b"event 0"), (1, b"event 1"), (2, b"event 2")], "token")
        with pytest.raises(StoreUnavailable):
            await there.append("resp_1", [(2, b"other bytes"), (3, b"event 3")], "token")
        assert await there.events("resp_1", -1, 0) == [(0, b"event 0"), (1, b"event 1"), (2, b"event 2")]


async def test_one_who_cannot_wait_reads_the_store(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """A run claimed here has kept nothing here yet, but the store may hold its events (another
    replica ended it after a takeover): a read that cannot wait (the sweeper's) reads the store."""
    async with replicas_of(replica_config(upstream, store).store) as (here, there):
        assert await here.claim("resp_1", "owner", "here", 10.0, Runs(10, 10)) is None
        await there.append("resp_1", [(0, b"event 0")], "here")
        assert await here.events("resp_1", -1, 0) == [(0, b"event 0")]


async def test_a_takeover_fences_out_the_holder_it_took_the_run_from(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """design.md 10.4: every write of a run is checked against its lease's fencing token in the
    same step: once another replica took the expired lease, the old holder's response, events
    and release are refused, and the taker's go through."""
    record = StoredResponse(id="resp_1", owner="owner", created_at=1, response=msgspec.Raw(b'{"status":"in_progress","output":[]}'), input_items=msgspec.Raw(b"[]"))
    async with replicas_of(replica_config(upstream, store).store) as (stale, taker):
        await stale.claim("resp_1", "owner", "stale-token", 0.05, Runs(10, 10))
        await stale.put(record, fence="stale-token")
        await stale.append("resp_1", [(0, b"event 0")], "stale-token")
        await asyncio.sleep(0.1)
        assert await taker.take("resp_1", "taker-token", 10.0)
        await taker.append("resp_1", [(1, b"failed, by the taker")], "taker-token")
        with pytest.raises(Fenced):
            await stale.append("resp_1", [(1, b"cancelled, by the stale holder")], "stale-token")
        with pytest.raises(Fenced):
            await stale.put(msgspec.structs.replace(record, response=msgspec.Raw(b'{"status":"cancelled","output":[]}')), fence="stale-token")
        await stale.release("resp_1", "stale-token")  # the taker's lease stays
        assert (await taker.renew("resp_1", "taker-token", 10.0)).held
        assert await taker.events("resp_1", -1, 0) == [(0, b"event 0"), (1, b"failed, by the taker")]
        assert bytes((await taker.get("resp_1", "owner")).response) == b'{"status":"in_progress","output":[]}'  # type: ignore[union-attr]
        await taker.release("resp_1", "taker-token")
        for token in ("stale-token", "taker-token"):  # no lease at all: a run that ended takes no more writes
            with pytest.raises(Fenced):
                await stale.append("resp_1", [(2, b"late")], token)
