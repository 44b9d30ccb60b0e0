"""Self-check of the fake upstream, through a real HTTP client."""

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score, sglang_error

STREAM = {"model": "m", "messages": [], "stream": True, "logprobs": True,
          "stream_options": {"include_usage": True}}


def turn(dialect: str) -> Generation:
    return Generation(dialect=dialect, steps=[  # type: ignore[arg-type]
        Step("reasoning", "Hmm", [score("Hmm")]),
        Step("text", "Hi", [score("Hi")]),
        Step("tool", '{"a":', tool_id="call_1", tool_name="f"),
        Step("tool", "1}"),
        Step("finish", scores=[score("<eos>")], finish_reason="tool_calls"),
    ])


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    upstream = FakeUpstream()
    await upstream.start()
    yield upstream
    await upstream.close()


async def raw_stream(fake: FakeUpstream, body: dict) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(f"{fake.url}/v1/chat/completions", json=body) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        return await r.read()


def events(raw: bytes) -> list[dict]:
    frames = [f.removeprefix(b"data: ") for f in raw.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_sglang_stream_shape(fake: FakeUpstream) -> None:
    fake.script(Reply(turn("sglang")))
    chunks = events(await raw_stream(fake, STREAM))
    assert fake.requests == [STREAM]
    assert all(set(c["choices"][0]["delta"]) == {"role", "content", "reasoning_content",
                                                 "tool_calls"} for c in chunks[:-1])
    assert chunks[1]["choices"][0]["delta"]["reasoning_content"] == "Hmm"
    second_fragment = chunks[4]["choices"][0]["delta"]["tool_calls"][0]
    assert second_fragment == {"id": None, "index": 0, "type": "function",
                               "function": {"name": None, "arguments": "1}"}}
    finish = chunks[5]["choices"][0]
    assert finish["finish_reason"] == "tool_calls"
    assert finish["logprobs"]["content"][0]["token"] == "<eos>"
    assert chunks[6]["choices"] == [] and chunks[6]["usage"]["completion_tokens"] == 3


async def test_vllm_stream_puts_finish_on_last_chunk(fake: FakeUpstream) -> None:
    fake.script(Reply(turn("vllm")))
    chunks = events(await raw_stream(fake, {**STREAM, "logprobs": False}))
    assert [c["choices"][0]["delta"] for c in chunks[1:3]] == [
        {"reasoning": "Hmm"}, {"content": "Hi", "tool_calls": []}]
    last = chunks[4]["choices"][0]
    assert last["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}
    assert last["finish_reason"] == "tool_calls" and "logprobs" not in last
    assert chunks[0]["id"].startswith("chatcmpl-") and len(chunks) == 6


async def test_write_size_one_gives_same_bytes(fake: FakeUpstream) -> None:
    generation = turn("sglang")
    fake.script(Reply(generation), Reply(generation, write_size=1))
    assert await raw_stream(fake, STREAM) == await raw_stream(fake, STREAM)


async def test_error_bodies_and_null_keys(fake: FakeUpstream) -> None:
    fake.script(sglang_error(503, "busy"), Reply(turn("vllm")))
    async with aiohttp.ClientSession() as s:
        url = f"{fake.url}/v1/chat/completions"
        async with s.post(url, json={"messages": [], "logprobs": None}) as r:
            assert r.status == 400 and (await r.json())["param"] == "logprobs"
        async with s.post(url, json={"messages": []}) as r:
            assert r.status == 503 and (await r.json())["message"] == "busy"
        async with s.post(url, json={"messages": [], "logprobs": True}) as r:
            message = (await r.json())["choices"][0]["message"]
            assert message["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
            assert "reasoning_content" not in message and message["reasoning"] == "Hmm"


@pytest.mark.parametrize("knob", [{"stall_after": 2}, {"delay": 0.02}])
async def test_client_disconnect_is_seen(fake: FakeUpstream, knob: dict) -> None:
    fake.script(Reply(turn("sglang"), **knob))
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{fake.url}/v1/chat/completions", json=STREAM)
        await r.content.readuntil(b"\n\n")
        assert fake.active_streams == 1
        r.close()
        await asyncio.wait_for(fake.disconnected.wait(), 0.5)
    assert fake.disconnects == 1 and fake.active_streams == 0


async def test_close_does_not_hang_on_stall(fake: FakeUpstream) -> None:
    fake.script(Reply(turn("sglang"), drop_after=1), Reply(turn("sglang"), stall_after=1))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientPayloadError):
            await raw_stream(fake, STREAM)
        r = await s.post(f"{fake.url}/v1/chat/completions", json=STREAM)
        await r.content.readuntil(b"\n\n")
        await asyncio.wait_for(fake.close(), 0.5)
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    assert fake.disconnects == 0
