"""The WebSocket transport (design.md 8.9) through the real proxy: the openai SDK's
`responses.connect()` and a bare aiohttp WebSocket as clients, the fake upstream behind."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest

from proxy.config import parse
from tests.client import LOGPROBS, validate_event
from tests.events import check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score, sglang_error

HELLO = Generation([Step("text", "Hello", [score("Hello")]), Step("text", " there", [score(" there")]), Step("finish", finish_reason="stop")])


async def one_turn(socket: aiohttp.ClientWebSocketResponse, frame: dict[str, Any]) -> list[dict]:
    """Send a frame; the events that answer it, to the terminal one (or an error frame)."""
    await socket.send_json(frame)
    events = []
    while True:
        event = await socket.receive_json(timeout=10)
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error") and not (
            event["type"] == "error" and "sequence_number" in event
        ):
            return events


async def test_turns_on_one_connection_chain_without_a_store(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """Each event of a turn is its SSE event's JSON, in a text frame of its own, the score
    contract whole (design.md 3.7); a later turn continues an unstored response of the same
    connection by `previous_response_id`, and another connection cannot."""
    upstream.script(Reply(HELLO), Reply(HELLO))
    async with http.ws_connect(f"{proxy}/v1/responses", headers={"OpenAI-Beta": "responses_websockets=2026-02-06"}) as socket:
        first = await one_turn(socket, {"type": "response.create", "model": "m", "input": "hi", "store": False, "include": LOGPROBS, "top_logprobs": 1})
        stream = check_stream(first)
        assert stream.text == "Hello there" and len(stream.logprobs) == 2
        for event in first:
            validate_event(event)
        response_id = first[-1]["response"]["id"]
        second = await one_turn(socket, {"type": "response.create", "model": "m", "input": "again", "store": False, "previous_response_id": response_id})
        assert second[-1]["type"] == "response.completed"
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["hi", "Hello there", "again"]
    async with http.ws_connect(f"{proxy}/v1/responses") as other:
        (error,) = await one_turn(other, {"type": "response.create", "model": "m", "input": "x", "previous_response_id": response_id})
    assert error["type"] == "error" and error["error"]["param"] == "previous_response_id"


async def test_generate_false_prepares_a_turn_to_continue(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """`generate: false` keeps the request's state without output (no upstream call), for a
    later turn to continue (a client prewarming its connection)."""
    upstream.script(Reply(HELLO))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        prepared = await one_turn(socket, {"type": "response.create", "model": "m", "instructions": "Be brief.", "input": "context", "generate": False, "store": False})
        assert [e["type"] for e in prepared] == ["response.created", "response.in_progress", "response.completed"]
        assert prepared[-1]["response"]["output"] == [] and upstream.requests == []
        await one_turn(socket, {"type": "response.create", "model": "m", "input": "go", "previous_response_id": prepared[-1]["response"]["id"]})
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["context", "go"]


@pytest.mark.parametrize(
    ("frame", "param"),
    [
        pytest.param(b"not json", None, id="not-json"),
        pytest.param({"type": "response.cancel"}, "type", id="another-type"),
        pytest.param({"type": "response.create", "model": "m"}, "input", id="no-input"),
        pytest.param({"type": "response.create", "model": "m", "input": "x", "background": True}, "background", id="background"),
    ],
)
async def test_a_bad_frame_is_an_error_frame_and_the_connection_goes_on(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, frame: Any, param: str | None
) -> None:
    upstream.script(Reply(HELLO))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        if isinstance(frame, bytes):
            await socket.send_bytes(frame)
            error = await socket.receive_json(timeout=10)
        else:
            (error,) = await one_turn(socket, frame)
        assert error["type"] == "error" and error["status"] == 400 and error["error"]["param"] == param
        after = await one_turn(socket, {"type": "response.create", "model": "m", "input": "hi"})
        assert after[-1]["type"] == "response.completed"


async def test_the_openai_sdk_over_the_websocket(upstream: FakeUpstream, proxy: str) -> None:
    upstream.script(Reply(HELLO))
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=10)
    try:
        async with client.responses.connect() as connection:
            await connection.send({"type": "response.create", "model": "m", "input": "hi", "store": False})
            kinds = []
            async for event in connection:
                kinds.append(event.type)
                if event.type == "response.completed":
                    assert event.response.output_text == "Hello there"
                    break
    finally:
        await client.close()
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds


async def test_off_it_is_a_426_and_a_plain_get_the_list(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 8.9: turned off, the handshake is refused with a 426, on which Codex goes on over HTTP."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "connections": {"websockets": False}}))
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"{url}/v1/responses")
    assert refused.value.status == 426
    async with http.get(f"{url}/v1/responses") as response:  # no upgrade: the stored responses (9.3)
        assert response.status == 200 and (await response.json())["object"] == "list"


async def test_a_long_chain_of_unstored_turns_goes_on(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 8.9: a connection keeps a few responses, each whole with its chain, so an agent
    loop of any length continues from the last."""
    upstream.script(Reply(HELLO))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        previous = None
        for i in range(20):
            frame = {"type": "response.create", "model": "m", "input": f"turn {i}", "store": False}
            events = await one_turn(socket, {**frame, **({"previous_response_id": previous} if previous else {})})
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
    said = [m["content"] for m in upstream.requests[-1]["messages"]]
    assert said[::2] == [f"turn {i}" for i in range(20)] and said[1::2] == ["Hello there"] * 19


async def test_a_client_that_closes_mid_turn_stops_the_generation(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 4.10: the socket is read while a turn runs; a close frame ends the turn and its
    upstream request at once, as a client leaving an SSE stream does."""
    long = Generation([*(Step("text", f"w{i} ") for i in range(40)), Step("finish", finish_reason="stop")])
    upstream.script(Reply(long, stall_after=4))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi"})
        assert (await socket.receive_json(timeout=10))["type"] == "response.created"
        await socket.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 2)


async def test_errors_come_as_a_turn_would_over_http(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 8.7, 8.9: a prompt over the context ends a turn with `response.failed`, as a
    stream over HTTP does; a frame nested past the limit is an error frame naming the field."""
    upstream.script(sglang_error(400, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."), Reply(HELLO))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        events = await one_turn(socket, {"type": "response.create", "model": "m", "input": "a long prompt"})
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
        assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"
        deep: Any = "x"
        for _ in range(200):
            deep = {"a": deep}
        (error,) = await one_turn(socket, {"type": "response.create", "model": "m", "input": "hi", "metadata": deep})
        assert error["type"] == "error" and error["error"]["param"] is not None and error["error"]["param"].startswith("metadata")
        assert (await one_turn(socket, {"type": "response.create", "model": "m", "input": "hi"}))[-1]["type"] == "response.completed"


async def test_a_stored_response_deleted_cannot_be_continued_on_its_connection(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    """design.md 8.9, 9.4: a stored response is read from the store, which a delete reaches."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": {"url": f"sqlite:{tmp_path}/r.db"}}))
    upstream.script(Reply(HELLO))
    async with http.ws_connect(f"{url}/v1/responses") as socket:
        made = (await one_turn(socket, {"type": "response.create", "model": "m", "input": "hi"}))[-1]["response"]["id"]
        async with http.delete(f"{url}/v1/responses/{made}") as deleted:
            assert deleted.status == 200
        (error,) = await one_turn(socket, {"type": "response.create", "model": "m", "input": "more", "previous_response_id": made})
    assert error["error"]["code"] == "previous_response_not_found"


@pytest.mark.parametrize("flood", ["frames", "bytes", "wide-characters"])
async def test_what_a_connection_queues_while_a_turn_runs_is_bounded(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, flood: str) -> None:
    """design.md 8.9: frames that come while a turn runs wait within a bound (frames, bytes):
    past it the client gets an error frame, the connection closes with 1008, and the turn
    running stops with its upstream request; nothing queued is run."""
    connections = {"websocket_queue": 4, "websocket_queue_bytes": 64 * 1024}
    proxy = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "connections": connections}))
    long = Generation([*(Step("text", f"w{i} ") for i in range(40)), Step("finish", finish_reason="stop")])
    upstream.script(Reply(long, stall_after=4))
    frame = {"type": "response.create", "model": "m", "input": "hi"}
    # Wide: 20,000 characters in all, but one emoji makes each str 4 bytes a character.
    inputs = {"frames": ["hi"] * 5, "bytes": ["x" * 40_000] * 2, "wide-characters": ["x" * 10_000 + "\N{GRINNING FACE}"] * 2}[flood]
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json(frame)
        assert (await socket.receive_json(timeout=10))["type"] == "response.created"
        for text in inputs:
            await socket.send_str(json.dumps({**frame, "input": text}, ensure_ascii=False))
        async with asyncio.timeout(10):  # unbounded, the frames would wait on the stalled turn for good
            messages = [message async for message in socket]
    errors = [message.json() for message in messages if message.type == aiohttp.WSMsgType.TEXT and message.json()["type"] == "error"]
    assert errors[-1]["status"] == 429 and "frames" in errors[-1]["error"]["message"], errors
    assert socket.close_code == 1008
    await asyncio.wait_for(upstream.disconnected.wait(), 2)
    assert len(upstream.requests) == 1


async def test_frames_within_the_bound_all_run_in_the_order_sent(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """design.md 8.9: as many frames as the bound allows wait while a turn runs, and each is
    then a turn of its own, in the order sent."""
    proxy = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "connections": {"websocket_queue": 4}}))
    upstream.script(Reply(HELLO, delay=0.1), *(Reply(HELLO) for _ in range(4)))
    async with http.ws_connect(f"{proxy}/v1/responses") as socket:
        await socket.send_json({"type": "response.create", "model": "m", "input": "turn 0"})
        assert (await socket.receive_json(timeout=10))["type"] == "response.created"
        for n in range(1, 5):
            await socket.send_json({"type": "response.create", "model": "m", "input": f"turn {n}"})
        completed = 0
        while completed < 5:
            event = await socket.receive_json(timeout=10)
            assert event["type"] != "error", event
            completed += event["type"] == "response.completed"
    assert [request["messages"][-1]["content"] for request in upstream.requests] == [f"turn {n}" for n in range(5)]
