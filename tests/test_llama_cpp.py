"""llama.cpp's wire (design.md 6.12, 6.13) through the real proxy, from the fake upstream taught
llama-server's shapes as recorded: token ids on every score, a zero probability as the lowest
float, the end-of-sequence entry, null and empty deltas, timings, its errors, and a connection
it closes after every stream. `make e2e` runs the same against the real llama-server."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy.config import parse
from tests.client import LOGPROBS, envelope
from tests.events import sent_scores
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import BODY, checked_stream, post

LOWEST_FLOAT = -3.4028234663852886e38


def llama_turn() -> Generation:
    return Generation(
        [
            Step("reasoning", "2+2 is 4.", [score("2"), score("+2 is 4.", LOWEST_FLOAT)]),
            Step("text", "The answer", [score("The"), score(" answer")]),
            Step("text", " is 4.", [score(" is 4.")]),
            Step("finish", finish_reason="stop", scores=[{**score(""), "bytes": []}]),  # the end-of-sequence entry
        ],
        dialect="llama.cpp",
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_llama_cpp_scores_come_out_in_the_responses_shape(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool) -> None:
    gen = llama_turn()
    upstream.script(Reply(gen))
    body = {**BODY, "include": LOGPROBS, "top_logprobs": 2}
    if stream:
        run = await checked_stream(http, proxy, body)
        scores, response = run.logprobs, run.response
        assert run.deltas[0][1][:2] == sent_scores(gen.chunks())[:2]  # reasoning's scores ride on the first text
    else:
        status, _, raw = await post(http, proxy, body)
        assert status == 200, raw
        response = orjson.loads(raw)
        scores = response["output"][-1]["content"][0]["logprobs"]
    assert scores == sent_scores(gen.chunks())  # as design.md 3.5 maps them: no id, -9999.0 for the lowest float
    assert all(set(s) == {"token", "logprob", "bytes", "top_logprobs"} for s in scores)
    assert all(set(t) == {"token", "logprob", "bytes"} for s in scores for t in s["top_logprobs"])
    assert scores[1]["logprob"] == -9999.0 and scores[-1] == {**scores[-1], "token": "", "bytes": []}
    assert response["output"][0]["content"][0]["text"] == "2+2 is 4."
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_scores_without_alternatives_from_an_upstream_asked_for_one(
    upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, stream: bool
) -> None:
    """design.md 3.1: llama-server asked for no alternatives sends no scores; a route with
    `min_top_logprobs: 1` asks for one and drops it, so that the client gets what it asked."""
    url = await start_proxy(parse({"upstreams": [{"name": "llama", "urls": [upstream.url], "min_top_logprobs": 1}]}))
    gen = llama_turn()
    upstream.script(Reply(gen))
    body = {key: value for key, value in BODY.items() if key != "top_logprobs"}
    if stream:
        run = await checked_stream(http, url, body)
        scores, response = run.logprobs, run.response
    else:
        status, _, raw = await post(http, url, body)
        assert status == 200, raw
        response = orjson.loads(raw)
        scores = response["output"][-1]["content"][0]["logprobs"]
    assert upstream.requests[-1]["top_logprobs"] == 1 and response["top_logprobs"] == 0
    assert scores == [{**s, "top_logprobs": []} for s in sent_scores(gen.chunks())]


async def test_ping_comments_and_an_error_frame_mid_stream(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    chunks = llama_turn().chunks()
    frames = [b": ping\n\n", *(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks[:3]), b": ping\n\n"]
    frames.append(b'data: {"error":{"code":500,"message":"slot failed","type":"server_error"}}\n\n')
    upstream.script(Reply(frames=frames))
    run = await checked_stream(http, proxy, {**BODY, "include": LOGPROBS})
    assert run.terminal == "response.failed"
    assert run.logprobs == sent_scores(chunks[:3])  # every score read before the error, on the message


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_its_refusal_of_scores_with_tools_on_a_stream_says_what_to_change(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, stream: bool) -> None:
    refusal = {"error": {"code": 400, "message": "logprobs is not supported with tools + stream", "type": "invalid_request_error"}}
    upstream.script(Reply(status=400, body=refusal))
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    status, _, raw = await post(http, proxy, {**BODY, "include": LOGPROBS, "tools": tools, "stream": stream})
    assert status == 400
    error = envelope(orjson.loads(raw), "invalid_request_error")
    assert error["param"] == "include"
    assert "logprobs is not supported with tools + stream" in error["message"] and "stream" in error["message"].split(":")[-1]


async def test_a_connection_it_closed_after_a_stream_costs_no_request(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """design.md 6.12: llama-server closes after every stream though it says keep-alive; a
    request that finds that connection dead in the pool goes again on a fresh one. Before, some
    in four of these calls was a 502."""
    gen = Generation([Step("text", "Hi", [score("Hi")]), Step("finish", finish_reason="stop")], dialect="llama.cpp")
    upstream.script(Reply(gen, close_after=0.002))
    statuses: dict[int, int] = {}
    for i in range(2000):
        async with http.post(f"{proxy}/v1/responses", json={**BODY, "stream": i % 2 == 0}) as response:
            await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
    assert statuses == {200: 2000}
    assert len(upstream.requests) == 2000  # none ran twice: the retried ones never reached it


async def test_a_failed_request_goes_again_once_at_most(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    """On a reused connection the retry is one, on a fresh connection: an upstream that hangs up
    on both gets the request twice and the client a 502. (On a fresh connection, a hang-up is
    not retried at all: tests/test_upstream_faults.py.)"""
    gen = Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")], dialect="llama.cpp")
    upstream.script(Reply(gen), Reply(gen, reset=True), Reply(gen, reset=True))
    assert (await post(http, proxy, BODY))[0] == 200  # a pooled connection now
    status, _, raw = await post(http, proxy, BODY)
    assert status == 502 and envelope(orjson.loads(raw), "upstream_unreachable")
    assert len(upstream.requests) == 3
