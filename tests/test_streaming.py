"""Streaming through the real proxy, a real loopback upstream and real clients."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from proxy.config import parse
from proxy.errors import UpstreamTimeout
from proxy.upstream.client import Exchange
from tests.client import LOGPROBS, read_events
from tests.events import expected_deltas, sent_scores, tokens, without_ids
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import checked_stream

BODY = {"model": "m", "input": "hi", "include": LOGPROBS, "top_logprobs": 2}


def seed() -> Generation:
    """design.md 3.7's example: reasoning A, text B, text C, finish, late score D."""
    return Generation([
        Step("reasoning", "A", [score("A")]),
        Step("text", "B", [score("B")]),
        Step("text", "C", [score("C")]),
        Step("finish", scores=[score("D")], finish_reason="stop"),
    ])


def tool_turn() -> Generation:
    return Generation([
        Step("reasoning", "hm", [score("h"), score("m")]),
        Step("text", "Hi", [score("Hi")]),
        Step("tool", '{"a":', tool_id="call_1", tool_name="f"),
        Step("scores", scores=[score("{"), score("a")]),
        Step("tool", "1}", [score("1}")]),
        Step("finish", finish_reason="tool_calls", scores=[score("<eos>")]),
    ])


def long_text(steps: int = 60) -> Generation:
    return Generation([Step("text", f"w{i} ", [score(f"w{i}")]) for i in range(steps)] + [Step("finish", finish_reason="stop")])


async def test_upstream_is_asked_to_stream_with_usage(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(seed()))
    await checked_stream(http, proxy, BODY, 5.0)
    (sent,) = upstream.requests
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["logprobs"] is True and sent["top_logprobs"] == BODY["top_logprobs"]


async def test_seed_case_however_the_upstream_writes(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    gen = seed()
    replies = [Reply(gen), Reply(gen, write_size=1), Reply(gen, coalesce=True), Reply(gen, line_ending="\r\n", write_size=7)]
    upstream.script(*replies)
    runs = [await checked_stream(http, proxy, BODY, 5.0) for _ in replies]
    chunks = gen.chunks()
    first = runs[0]
    assert first.terminal == "response.completed"
    assert [tokens(s) for _, s in first.deltas] == [["A", "B"], ["C"]]
    assert first.deltas == expected_deltas(chunks)
    assert first.logprobs == sent_scores(chunks) and tokens(first.logprobs) == ["A", "B", "C", "D"]
    for run in runs[1:]:
        assert without_ids(run.events) == without_ids(first.events)


async def test_sdk_stream_helper_matches_non_streaming(upstream: FakeUpstream, sdk: openai.AsyncOpenAI) -> None:
    gen = tool_turn()
    upstream.script(Reply(gen), Reply(gen, write_size=5))
    whole = await sdk.responses.parse(**BODY)
    async with sdk.responses.stream(**BODY) as events:
        types = [event.type async for event in events]
        final = await events.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert without_ids(final.model_dump(mode="json")) == without_ids(whole.model_dump(mode="json"))
    assert [lp.token for lp in final.output[1].content[0].logprobs] == tokens(sent_scores(gen.chunks()))


async def test_event_larger_than_a_line_limit(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    text = "x" * (3 * 1024 * 1024)
    gen = Generation([Step("text", text, [score("x")]), Step("finish", finish_reason="stop")])
    upstream.script(Reply(gen, write_size=64 * 1024))
    run = await checked_stream(http, proxy, BODY, 5.0)
    assert run.terminal == "response.completed" and run.text == text


@pytest.mark.parametrize("pacing", [{"stall_after": 4}, {"delay": 0.05}], ids=["stalled", "paced"])
async def test_client_disconnect_cancels_the_upstream(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, pacing: dict
) -> None:
    upstream.script(Reply(long_text(), **pacing))
    async with http.post(f"{proxy}/v1/responses", json={**BODY, "stream": True}) as response:
        seen = []
        async for event in read_events(response):
            seen.append(event["type"])
            if event["type"] == "response.output_text.delta":
                break
        response.close()
    assert seen[-1] == "response.output_text.delta"
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)
    assert upstream.disconnects == 1


CHUNKS = tool_turn().chunks()


@pytest.mark.parametrize(
    ("reply", "terminal", "read"),
    [
        (dict(error_frame_after=3), "response.failed", 3),
        (dict(error_frame_after=3, write_size=11), "response.failed", 3),
        (dict(drop_after=3), "response.failed", 3),
        (dict(done=False), "response.completed", len(CHUNKS)),
        (dict(extra_frames=[b"data: garbage\n\n"]), "response.completed", len(CHUNKS)),  # after the finish: usage lost (4.9)
    ],
    ids=["error-frame", "error-frame-split", "dropped", "no-done", "garbage"],
)
async def test_upstream_faults(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, reply: dict, terminal: str, read: int
) -> None:
    """Each ends with one terminal event and [DONE] (the framing checked on every event), the
    scores read before the fault on the message, and never a hang."""
    upstream.script(Reply(tool_turn(), **reply))
    run = await checked_stream(http, proxy, BODY, 5.0)
    assert run.terminal == terminal
    assert run.logprobs == sent_scores(CHUNKS[:read])


@pytest.mark.parametrize(
    ("timeouts", "reply"),
    [({"idle": 0.3}, {"stall_after": 3}), ({"total": 0.5}, {"delay": 0.2})],
    ids=["idle-stalled", "total-slow"],
)
async def test_stalled_upstream_times_out(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, timeouts: dict, reply: dict) -> None:
    """An upstream that goes silent (idle), or trickles on past the whole exchange's limit."""
    config = parse({"upstreams": [{"name": "default", "urls": [upstream.url], "timeouts": timeouts}]})
    proxy = await start_proxy(config)
    upstream.script(Reply(tool_turn(), **reply))
    run = await checked_stream(http, proxy, BODY, 3.0)
    assert run.terminal == "response.failed"
    assert run.events[-2]["code"] == UpstreamTimeout.code
    # Every score that arrived in time reaches the client, and the cut comes before the end:
    # all that came before the stall, a strict prefix of a stream slower than `total`.
    everything = sent_scores(CHUNKS)
    if "stall_after" in reply:
        assert run.logprobs == sent_scores(CHUNKS[: reply["stall_after"]])
    else:
        assert run.logprobs == everything[: len(run.logprobs)] and len(run.logprobs) < len(everything)
    # The stalled upstream request is given up, not left hanging.
    await asyncio.wait_for(upstream.disconnected.wait(), 2.0)


async def test_a_stream_is_one_write_per_upstream_read_with_its_headers_and_its_end(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """design.md 4.10: the headers leave with the first events, the body's end with the last
    ones; no write carries only headers or only the end of the chunked body."""
    port = int(proxy.rsplit(":", 1)[1])
    writes: list[bytes] = []
    transport_type = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    write, writelines = transport_type.write, transport_type.writelines

    def seen(transport: asyncio.Transport, data: bytes) -> None:
        if transport.get_extra_info("sockname")[1] == port:  # the proxy's side of the client's connection
            writes.append(bytes(data))

    monkeypatch.setattr(transport_type, "write", lambda self, data: (seen(self, data), write(self, data))[1])
    monkeypatch.setattr(transport_type, "writelines", lambda self, chunks: (seen(self, b"".join(chunks)), writelines(self, chunks))[1])
    reads = 0
    read_chunk = Exchange.read_chunk

    async def counted(self: Exchange) -> bytes:
        nonlocal reads
        reads += 1
        return await read_chunk(self)

    monkeypatch.setattr(Exchange, "read_chunk", counted)
    upstream.script(Reply(seed(), delay=0.02))
    await checked_stream(http, proxy, BODY, 5.0)
    # The start, then a write per upstream read that made events (not every read makes one: a
    # usage chunk alone does not): never more than one write a read.
    assert 4 <= len(writes) <= reads + 1, (len(writes), reads)
    first, last = writes[0], writes[-1]
    assert first.startswith(b"HTTP/1.1 200") and b"response.created" in first and b"response.in_progress" in first
    assert b"response.completed" in last and last.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert all(b"data: " in w for w in writes)  # none of only headers, or only the body's end
