"""Upstream faults through the real proxy: whatever the upstream does, the client
gets a clear error or a `response.failed`, a stream ends with exactly one terminal event, and
afterwards no upstream connection is held, no pooled connection is broken and no task is left.

The harness (`launch`, `settled`, `healthy`) is in conftest.py and harness.py."""

from __future__ import annotations

import orjson
import pytest

from tests.client import envelope, validate_response
from tests.events import framed, sent_scores
from tests.fake_upstream import (
    STREAM_ERROR_MESSAGE,
    Generation,
    Reply,
    Step,
    score,
    sglang_error,
    vllm_error,
)
from tests.harness import BODY, checked_stream, free_port, healthy, post, settled, turn

FAST = {"first_byte": 0.75, "idle": 0.75}  # for the timeout cases only: their stalls never end


# -- generations ------------------------------------------------------------------------------


def parallel_calls(dialect: str) -> Generation:
    """Two tool calls; each id and name only on the call's first fragment."""
    return Generation(
        [
            Step("tool", "", [score("<tc>")], tool_index=0, tool_id="call_a", tool_name="weather"),
            Step("tool", '{"city": ', [score('{"city": ')], tool_index=0),
            Step("tool", '"Paris"}', [score('"Paris"}')], tool_index=0),
            Step("tool", '{"q"', [score('{"q"')], tool_index=1, tool_id="call_b", tool_name="search"),
            Step("scores", scores=[score(":")]),
            Step("tool", ': "x"}', [score(' "x"}')], tool_index=1),
            Step("finish", finish_reason="tool_calls", scores=[score("<eos>")]),
        ],
        dialect=dialect,
    )


DONE = b"data: [DONE]\n\n"


# -- before any answer: an HTTP error in both modes -------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
async def test_connection_refused_is_502(launch, http, baseline, streaming: bool) -> None:
    running = await launch(url=f"http://127.0.0.1:{free_port()}")
    status, kind, raw = await post(http, running.url, {**BODY, "stream": streaming})
    assert (status, kind) == (502, "application/json")
    envelope(orjson.loads(raw), "upstream_unreachable", type="server_error")
    await settled(running, None, baseline)


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("reply", "status", "code", "timeouts"),
    [
        pytest.param(Reply(reset=True), 502, "upstream_unreachable", None, id="reset-before-headers"),
        pytest.param(Reply(turn(), headers_delay=30), 504, "upstream_timeout", FAST, id="first-byte-timeout"),
        pytest.param(sglang_error(500, "CUDA out of memory"), 502, "server_error", None, id="sglang-500"),
        pytest.param(vllm_error(503, "overloaded"), 502, "server_error", None, id="vllm-503"),
        pytest.param(Reply(status=502, body=b"<html>bad gateway</html>"), 502, "server_error", None, id="html-502"),
    ],
)
async def test_no_answer_is_a_gateway_error(
    upstream, launch, http, baseline, reply: Reply, status: int, code: str, timeouts, streaming: bool
) -> None:
    running = await launch(timeouts=timeouts)
    upstream.script(reply)
    got, kind, raw = await post(http, running.url, {**BODY, "stream": streaming})
    assert (got, kind) == (status, "application/json"), raw
    envelope(orjson.loads(raw), code, type="server_error")
    assert len(upstream.requests) == 1  # a request that may have reached the GPU is never repeated
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("reply", "status", "code", "message", "param"),
    [
        pytest.param(sglang_error(400, "context too long", "messages"), 400, "invalid_request_error", "context too long", "messages", id="sglang-flat"),
        pytest.param(vllm_error(422, "top_logprobs too big", "top_logprobs"), 422, "invalid_request_error", "top_logprobs too big", "top_logprobs", id="vllm-nested"),
        pytest.param(Reply(status=429, body=b"slow down, please\n"), 429, "rate_limit_exceeded", "slow down, please", None, id="text-429"),
        pytest.param(Reply(status=404, body=b""), 404, "not_found", None, None, id="empty-404"),
    ],
)
async def test_upstream_4xx_keeps_its_status_and_words(
    upstream, launch, http, baseline, reply: Reply, status: int, code: str, message: str | None, param: str | None, streaming: bool
) -> None:
    """design.md 5.5: the status, that status's code, and the upstream's words."""
    running = await launch()
    upstream.script(reply)
    got, kind, raw = await post(http, running.url, {**BODY, "stream": streaming})
    assert (got, kind) == (status, "application/json"), raw
    error = envelope(orjson.loads(raw), code, type="invalid_request_error")
    if message is not None:
        assert (error["message"], error["param"]) == (message, param)
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


# -- non-streaming bodies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status", "code", "timeouts"),
    [
        pytest.param(Reply(turn(), body_drop_after=25), 502, "upstream_unreachable", None, id="reset-mid-body"),
        pytest.param(Reply(turn(), body_stall_after=0), 504, "upstream_timeout", FAST, id="headers-then-silence"),
        pytest.param(Reply(turn(), body_stall_after=25), 504, "upstream_timeout", FAST, id="silence-mid-body"),
        pytest.param(Reply(status=200, body=b"<html>hello</html>"), 502, "upstream_protocol_error", None, id="non-json-200"),
        pytest.param(Reply(status=200, body=b'{"choices": [{"message": {"content": 5}}]}'), 502, "upstream_protocol_error", None, id="wrong-shape-200"),
        pytest.param(Reply(status=200, body=b"[1, 2]"), 502, "upstream_protocol_error", None, id="array-200"),
    ],
)
async def test_non_streaming_body_faults(upstream, launch, http, baseline, reply: Reply, status: int, code: str, timeouts) -> None:
    running = await launch(timeouts=timeouts)
    upstream.script(reply)
    got, kind, raw = await post(http, running.url, BODY)
    assert (got, kind) == (status, "application/json"), raw
    envelope(orjson.loads(raw), code, type="server_error")
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
async def test_unknown_finish_reason_non_streaming(upstream, launch, http, baseline, dialect: str) -> None:
    running = await launch()
    gen = turn(dialect, finish="eos_token_reached")
    upstream.script(Reply(gen))
    status, _, raw = await post(http, running.url, BODY)
    assert status == 200, raw
    response = orjson.loads(raw)
    validate_response(response)
    assert response["status"] == "completed"
    (message,) = [item for item in response["output"] if item["type"] == "message"]
    assert message["content"][0]["text"] == "Hello world"
    assert message["content"][0]["logprobs"] == sent_scores(gen.chunks())
    await settled(running, upstream, baseline)


# -- streams ------------------------------------------------------------------------------------

CHUNKS = turn().chunks()  # role, 2 reasoning, text, scores, text, finish, usage
FINISH = 6  # the index of the finish chunk in CHUNKS
LOST = (0, 0)  # the token counts of a response whose usage chunk was never read


@pytest.mark.parametrize(
    ("reply", "terminal", "code", "read", "timeouts", "usage"),
    [
        pytest.param(dict(drop_after=4), "response.failed", "upstream_unreachable", 4, None, LOST, id="reset-mid-stream"),
        pytest.param(dict(drop_after=4, write_size=7), "response.failed", "upstream_unreachable", 4, None, LOST, id="reset-mid-frame"),
        pytest.param(dict(drop_after=FINISH + 1), "response.completed", None, FINISH + 1, None, LOST, id="reset-after-finish"),
        pytest.param(dict(stall_after=0), "response.failed", "upstream_timeout", 0, FAST, LOST, id="headers-then-silence"),
        pytest.param(dict(stall_after=3), "response.failed", "upstream_timeout", 3, FAST, LOST, id="silence-mid-stream"),
        pytest.param(dict(stall_after=FINISH + 1), "response.completed", None, FINISH + 1, FAST, LOST, id="silence-after-finish"),
        pytest.param(dict(done=False), "response.completed", None, len(CHUNKS), None, None, id="no-done"),
        *(
            pytest.param(dict(frames=[*framed(CHUNKS[: FINISH + 1]), *tail]), "response.completed", None, FINISH + 1, None, usage, id=id)
            for id, tail, usage in [
                ("clean-end-in-the-usage-frame", [b'data: {"choices":[],"us'], LOST),
                ("a-garbled-usage-frame", [b'data: {"choices":[],"us\n\n', b"data: [DONE]\n\n"], LOST),
                ("usage-with-a-null-count", [b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":null}}\n\n', b"data: [DONE]\n\n"], (5, 0)),
            ]
        ),
    ],
)
async def test_stream_broken_off(
    upstream, launch, http, baseline, reply: dict, terminal: str, code: str | None, read: int, timeouts, usage: tuple[int, int] | None
) -> None:
    """Cut before the finish: `response.failed` with the scores read so far on the message;
    cut after it: `response.completed` (only the usage or `[DONE]` was lost: its counts are
    zeros, design.md 4.9, 5.1). `usage`: (input, output) tokens, None where the usage came whole."""
    running = await launch(timeouts=timeouts)
    upstream.script(Reply(turn(), **reply))
    run = await checked_stream(http, running.url, BODY)
    assert run.terminal == terminal
    if usage is not None:
        counts = run.response["usage"]
        assert (counts["input_tokens"], counts["output_tokens"], counts["total_tokens"]) == (*usage, sum(usage))
    assert run.logprobs == sent_scores(CHUNKS[:read])
    if code is not None:
        assert run.events[-2]["code"] == code
        if run.message is not None:  # the items still open at the cut end incomplete
            assert run.message.item["status"] == "incomplete"
    else:
        assert run.text == "Hello world"
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize("at", [1, 3, FINISH])
async def test_error_frame_then_finish_and_usage(upstream, launch, http, baseline, at: int) -> None:
    """SGLang sends finish and usage chunks and `[DONE]` after its error frame: the client
    gets one `response.failed`, and the rest is read so the connection goes back to the pool."""
    running = await launch()
    upstream.script(Reply(turn(), error_frame_after=at))
    run = await checked_stream(http, running.url, BODY)
    assert run.terminal == "response.failed"
    assert run.events[-2]["message"] == run.response["error"]["message"] == STREAM_ERROR_MESSAGE
    assert run.logprobs == sent_scores(CHUNKS[:at])
    await settled(running, upstream, baseline)
    assert upstream.disconnects == 0 and len(running.pooled()) == 1  # drained, kept, reusable
    await healthy(http, running, upstream)
    assert upstream.disconnects == 0


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"message": "", "code": 500}, id="empty-message"),
        pytest.param({"message": "   ", "code": 500}, id="blank-message"),
        pytest.param({"code": 503}, id="no-message"),
        pytest.param({"message": "kv cache full", "code": "internal_error"}, id="string-code"),
    ],
)
async def test_error_frame_always_says_something(upstream, launch, http, baseline, error: dict) -> None:
    """Whatever the upstream's error frame holds, the client's `error` event and
    `response.error` carry a message (an empty one explains nothing) and a string code."""
    running = await launch()
    frames = framed(CHUNKS)
    upstream.script(Reply(frames=[*frames[:3], b"data: " + orjson.dumps({"error": error}) + b"\n\n", DONE]))
    run = await checked_stream(http, running.url, BODY)  # check_stream: a non-empty message, string codes
    assert run.terminal == "response.failed"
    assert run.events[-2]["message"].strip()
    await settled(running, upstream, baseline)


GARBAGE = [
    pytest.param(b"data: garbage\n\n", id="garbage-data"),
    pytest.param(b'data: {"choices": [{"delta": {"content": "x"\n\n', id="half-json"),
    pytest.param(b'data: {"choices": [{"delta": {"content": 5}}]}\n\n', id="wrong-type"),
    pytest.param(b'data: {"choices": 7}\n\n', id="choices-not-a-list"),
    pytest.param(b"data: \xff\xfe\n\n", id="not-utf8"),
    pytest.param(b"data: null\n\n", id="null"),
]


async def fails_unreadable(http, running, upstream, baseline, *, read: int) -> None:
    """The stream fails as unreadable, with the scores of the `read` chunks that came before;
    nothing is left over and the proxy goes on serving."""
    run = await checked_stream(http, running.url, BODY)
    assert run.terminal == "response.failed"
    assert run.events[-2]["code"] == "upstream_protocol_error"
    assert run.logprobs == sent_scores(CHUNKS[:read])
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize("at", [1, 4])
@pytest.mark.parametrize("garbage", GARBAGE)
async def test_unreadable_data_fails_the_stream(upstream, launch, http, baseline, garbage: bytes, at: int) -> None:
    running = await launch()
    frames = framed(CHUNKS)
    upstream.script(Reply(frames=[*frames[:at], garbage, *frames[at:], DONE]))
    await fails_unreadable(http, running, upstream, baseline, read=at)


@pytest.mark.parametrize("garbage", GARBAGE)
async def test_unreadable_data_after_the_finish_is_usage_lost(upstream, launch, http, baseline, garbage: bytes) -> None:
    """design.md 4.9: the generation finished: it completes there, every score on it."""
    running = await launch()
    frames = framed(CHUNKS)
    upstream.script(Reply(frames=[*frames[: FINISH + 1], garbage, *frames[FINISH + 1 :], DONE]))
    run = await checked_stream(http, running.url, BODY)
    assert run.terminal == "response.completed" and run.logprobs == sent_scores(CHUNKS)
    assert run.response["usage"]["total_tokens"] == 0  # it completes there: the usage after it is unread
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize(
    "noise",
    [
        pytest.param(b": keep-alive comment\n\n", id="comment"),
        pytest.param(b"event: ping\n\n", id="event-line"),
        pytest.param(b"id: 7\nretry: 100\n\n", id="id-retry"),
        pytest.param(b"garbage without a field\n\n", id="unknown-line"),
        pytest.param(b"\n\n\n", id="blank-lines"),
        pytest.param(b'data: {"choices": []}\n\n', id="empty-choices-no-usage"),
        pytest.param(b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": null}\n\n', id="empty-choices-null-usage"),
        pytest.param(b'data: {"choices": [{"index": 1, "delta": {"content": "other choice"}}]}\n\n', id="other-choice"),
    ],
)
async def test_noise_between_chunks_is_ignored(upstream, launch, http, baseline, noise: bytes) -> None:
    running = await launch()
    frames = framed(CHUNKS)
    # Around every chunk, and once more before [DONE].
    upstream.script(Reply(frames=[b for f in frames for b in (noise, f)] + [noise, DONE]))
    run = await checked_stream(http, running.url, BODY)
    assert (run.terminal, run.text) == ("response.completed", "Hello world")
    assert run.logprobs == sent_scores(CHUNKS)
    assert run.response["usage"]["output_tokens"] == CHUNKS[-1]["usage"]["completion_tokens"]
    await settled(running, upstream, baseline)


@pytest.mark.parametrize(
    ("frames", "read"),
    [
        pytest.param(framed(CHUNKS[:4]), 4, id="clean-eof-before-finish"),
        pytest.param([*framed(CHUNKS[:4]), framed(CHUNKS[4:5])[0][:30]], 4, id="clean-eof-inside-a-frame"),
        pytest.param([b"<html><body>502 Bad Gateway</body></html>"], 0, id="html-200-stream"),
        pytest.param([b'{"object": "chat.completion", "choices": []}'], 0, id="json-200-stream"),
        pytest.param([], 0, id="empty-200-stream"),
        pytest.param([DONE], 0, id="only-done"),
    ],
)
async def test_stream_ending_before_a_finish_fails(upstream, launch, http, baseline, frames: list[bytes], read: int) -> None:
    running = await launch()
    upstream.script(Reply(frames=frames))
    await fails_unreadable(http, running, upstream, baseline, read=read)


async def test_event_over_two_mib(upstream, launch, http, baseline) -> None:
    running = await launch()
    reasoning, text = "r" * (2 * 1024 * 1024 + 17), "t" * (2 * 1024 * 1024 + 5)
    gen = Generation([Step("reasoning", reasoning, [score("r")]), Step("text", text, [score("t")]), Step("finish", finish_reason="stop")])
    upstream.script(Reply(gen, write_size=8192))
    run = await checked_stream(http, running.url, BODY, seconds=30)
    assert run.terminal == "response.completed"
    assert run.text == text and run.of_type("reasoning")[0]["content"][0]["text"] == reasoning
    assert run.logprobs == sent_scores(gen.chunks())
    await settled(running, upstream, baseline)


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
async def test_one_byte_per_write(upstream, launch, http, baseline, dialect: str) -> None:
    """A whole stream with reasoning, text and two tool calls, one byte per write, CRLF lines."""
    running = await launch()
    gen = Generation(turn(dialect).steps[:-1] + parallel_calls(dialect).steps, dialect=dialect)
    upstream.script(Reply(gen, write_size=1, line_ending="\r\n"), Reply(gen))
    run = await checked_stream(http, running.url, BODY, seconds=30)
    whole = await checked_stream(http, running.url, BODY)
    assert run.terminal == "response.completed"
    assert (run.text, run.logprobs) == (whole.text, whole.logprobs) == ("Hello world", sent_scores(gen.chunks()))
    assert [(c["call_id"], c["arguments"]) for c in run.of_type("function_call")] == [
        ("call_a", '{"city": "Paris"}'),
        ("call_b", '{"q": "x"}'),
    ]
    await settled(running, upstream, baseline)


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
async def test_tool_call_id_only_on_first_fragment(upstream, launch, http, baseline, dialect: str) -> None:
    running = await launch()
    gen = parallel_calls(dialect)
    upstream.script(Reply(gen), Reply(gen))
    run = await checked_stream(http, running.url, {**BODY, "tools": TOOLS})
    assert run.terminal == "response.completed"
    calls = run.of_type("function_call")
    assert [(c["call_id"], c["name"], c["arguments"], c["status"]) for c in calls] == [
        ("call_a", "weather", '{"city": "Paris"}', "completed"),
        ("call_b", "search", '{"q": "x"}', "completed"),
    ]
    # The empty message that carries the scores (design.md 3.9) comes last.
    assert run.response["output"][-1]["type"] == "message" and run.text == ""
    assert run.logprobs == sent_scores(gen.chunks())
    status, _, raw = await post(http, running.url, {**BODY, "tools": TOOLS})
    assert status == 200
    plain = [item for item in orjson.loads(raw)["output"] if item["type"] == "function_call"]
    assert [(c["call_id"], c["arguments"]) for c in plain] == [(c["call_id"], c["arguments"]) for c in calls]
    await settled(running, upstream, baseline)


TOOLS = [
    {"type": "function", "name": "weather", "parameters": {"type": "object"}},
    {"type": "function", "name": "search", "parameters": {"type": "object"}},
]


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
@pytest.mark.parametrize("reason", ["eos_token_reached", "", "STOP"])
async def test_unknown_finish_reason_streaming(upstream, launch, http, baseline, dialect: str, reason: str) -> None:
    """A finish reason the proxy does not know still ends the generation: completed, exact."""
    running = await launch()
    gen = turn(dialect, finish=reason)
    upstream.script(Reply(gen))
    run = await checked_stream(http, running.url, BODY)
    assert (run.terminal, run.text) == ("response.completed", "Hello world")
    assert run.logprobs == sent_scores(gen.chunks())
    await settled(running, upstream, baseline)
