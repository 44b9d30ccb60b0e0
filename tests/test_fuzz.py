"""Fuzzing.

1. The SSE decoder and the translator together, sans I/O: any bytes from the upstream, split
   anywhere, ended cleanly or broken off, never raise out of the translator and always end in
   exactly one terminal event, the whole event contract holding (`check_stream`).
2. The HTTP front: arbitrary JSON bodies, and mutations of valid ones, never get a 500 and
   never make a handler raise; what is refused is refused in the OpenAI envelope.
"""

from __future__ import annotations

import logging
from typing import Any

import openai.types.responses as sdk
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import parse
from proxy.errors import UpstreamUnreachable
from proxy.responses.translate import ResponseTranslator
from tests.client import LOGPROBS, SDK_EVENT, parse_sse
from tests.events import TERMINAL, check_stream, frame, framed, plan, split
from tests.fake_upstream import Generation, Reply, Step, score

# -- 1. SSE decoder + translator ------------------------------------------------------------------

short = st.text(max_size=6)
maybe = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731
# Any JSON value, small.
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), short),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(short, inner, max_size=3)),
    max_leaves=8,
)
# Sometimes the right type, sometimes anything.
def loosely(strategy):
    return st.one_of(strategy, strategy, strategy, json_values)


entries = st.fixed_dictionaries(
    {"token": loosely(short)},
    optional={
        "logprob": loosely(maybe(st.floats(-1e6, 0))),
        "bytes": loosely(maybe(st.lists(st.integers(0, 255), max_size=3))),
        "top_logprobs": loosely(maybe(st.lists(st.fixed_dictionaries({"token": short, "logprob": maybe(st.floats(-50, 0))}), max_size=2))),
    },
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "index": loosely(maybe(st.integers(0, 2))),
            "id": loosely(maybe(st.sampled_from(["call_a", "call_b", ""]))),
            "type": st.just("function"),
            "function": loosely(st.fixed_dictionaries({}, optional={"name": loosely(maybe(st.sampled_from(["f", "g", ""]))), "arguments": loosely(maybe(short))})),
        },
    ),
    max_size=2,
)
deltas = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": loosely(maybe(short)),
        "reasoning_content": loosely(maybe(short)),
        "reasoning": loosely(maybe(short)),
        "tool_calls": loosely(maybe(tool_calls)),
    },
)
FINISH_REASONS = ["stop", "length", "tool_calls", "content_filter", "abort", "function_call", "eos", ""]
choices = st.fixed_dictionaries(
    {},
    optional={
        "index": loosely(st.sampled_from([0, 0, 0, 1])),
        "delta": loosely(maybe(deltas)),
        "message": loosely(maybe(deltas)),
        "logprobs": loosely(maybe(st.fixed_dictionaries({"content": loosely(maybe(st.lists(entries, max_size=3)))}))),
        "finish_reason": loosely(maybe(st.sampled_from(FINISH_REASONS))),
    },
)
usage = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": loosely(st.integers(0, 100)),
        "completion_tokens": loosely(st.integers(0, 100)),
        "reasoning_tokens": loosely(maybe(st.integers(0, 100))),
        "prompt_tokens_details": loosely(maybe(st.fixed_dictionaries({"cached_tokens": maybe(st.integers(0, 9))}))),
        "completion_tokens_details": loosely(maybe(st.fixed_dictionaries({"reasoning_tokens": maybe(st.integers(0, 9))}))),
    },
)
chunks = st.fixed_dictionaries(
    {},
    optional={
        "choices": loosely(maybe(st.lists(choices, max_size=2))),
        "usage": loosely(maybe(usage)),
        "error": st.one_of(st.fixed_dictionaries({"message": short, "code": st.one_of(st.integers(100, 599), short, st.none())}), json_values),
    },
)


def good_steps(draw) -> list[bytes]:
    """A well-formed generation's frames, to be mixed with the rest."""
    steps = [Step("text", "a", [score("a")]), Step("reasoning", "r", [score("r")]), Step("scores", scores=[score("s")]),
             Step("tool", '{"x":', [score("t")], tool_index=0, tool_id="call_1", tool_name="f"), Step("tool", "1}", tool_index=0)]
    picked = draw(st.lists(st.sampled_from(steps), max_size=5))
    finish = draw(st.sampled_from([*FINISH_REASONS, None]))
    if finish is not None:
        picked.append(Step("finish", finish_reason=finish, scores=[score("e")]))
    gen = Generation(picked, dialect=draw(st.sampled_from(["sglang", "vllm"])))
    return framed(gen.chunks())


@st.composite
def upstream_bodies(draw) -> bytes:
    """Bytes as an upstream might send them, broken in every way: frames of real and random
    chunks, error frames, [DONE] anywhere, comments and unknown lines, half frames, invalid
    JSON and UTF-8, numbers out of range, and plain random bytes; either line ending."""
    kind = draw(st.sampled_from(["frames", "frames", "frames", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    nl = draw(st.sampled_from([b"\n", b"\r\n", b"\r\n\n"]))
    frames: list[bytes] = good_steps(draw) if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 8))):
        noise = draw(
            st.one_of(
                chunks.map(frame),
                st.sampled_from([
                    b"data: [DONE]\n\n", b": comment\n\n", b"event: error\n\n", b"data:\n\n", b"\n", b"data: garbage\n\n",
                    b'data: {"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [{"token": "x", "logprob": 1e400}]}}]}\n\n',
                    b'data: {"choices": [{"index": 99999999999999999999, "delta": {"content": "x"}}]}\n\n',
                    b'data: {"choices": [{"delta": {"content": "\\ud800"}}]}\n\n',
                    b"data: \xc3\x28\n\n", b'data: {"choices": [{"delta": {"content": "x"', b"data: {}\n\n", b"data: []\n\n",
                    b'data: {"error": {"message": "boom", "code": 503}}\n\n', b"retry: x\nid: \x00\n\n",
                ]),
                st.binary(max_size=40),
            )
        )
        frames.insert(draw(st.integers(0, len(frames))), noise)
    return b"".join(frames).replace(b"\n", nl)


def pieces(data: st.DataObject, body: bytes) -> list[bytes]:
    return split(body, data.draw(st.lists(st.integers(0, len(body)), max_size=10)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(upstream_bodies(), st.booleans(), st.sampled_from(["finish", "fail", "fail-early"]), st.data())
def test_any_upstream_bytes_end_in_one_terminal_event(body: bytes, logprobs: bool, ending: str, data: st.DataObject) -> None:
    translator = ResponseTranslator(plan(logprobs, tools=[{"type": "function", "name": "f"}]))
    parts = pieces(data, body)
    if ending == "fail-early":
        parts = parts[: data.draw(st.integers(0, len(parts)))]
    out = [translator.start()]
    for part in parts:
        out.append(translator.feed(part))
    if ending == "finish":
        out.append(translator.finish())
    else:
        out.append(translator.fail(UpstreamUnreachable("upstream connection failed: reset")))
    assert translator.done
    # After the end nothing more is written, whatever comes.
    assert translator.feed(b"data: [DONE]\n\n") == translator.finish() == b""
    stream = check_stream(parse_sse(b"".join(out)))
    # What the handler keeps (for metrics) is what the client was sent.
    assert stream.response == orjson.loads(orjson.dumps(translator.response))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_one_byte_at_a_time_is_the_same_as_all_at_once(data: st.DataObject) -> None:
    body = data.draw(upstream_bodies())
    runs = []
    for pieces_of_body in ([body], [body[i : i + 1] for i in range(len(body))]):
        translator = ResponseTranslator(plan(True))
        raw = translator.start() + b"".join(translator.feed(p) for p in pieces_of_body) + translator.finish()
        runs.append(check_stream(parse_sse(raw)))
    one, other = runs
    strip = lambda s: [(e["type"], e.get("delta"), e.get("text"), e.get("logprobs")) for e in s.events]  # noqa: E731
    assert strip(one) == strip(other)


# -- 2. HTTP bodies ---------------------------------------------------------------------------------

FIELDS = [
    "model", "input", "instructions", "include", "top_logprobs", "max_output_tokens", "temperature", "top_p",
    "presence_penalty", "frequency_penalty", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
    "stream", "stream_options", "store", "metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier",
    "truncation", "previous_response_id", "background", "max_tool_calls", "prompt", "conversation",
]
TOOL = {"type": "function", "name": "weather", "description": "d", "parameters": {"type": "object", "properties": {}}, "strict": True}
VALID = [
    {"model": "m", "input": "hi"},
    {"model": "m", "input": "hi", "include": LOGPROBS, "top_logprobs": 3, "stream": True},
    {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "q"}, {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}, "verbosity": "low"},
        "reasoning": {"effort": "high", "summary": "auto"},
        "max_output_tokens": 100,
        "temperature": 0.5,
        "top_p": 0.9,
        "metadata": {"k": "v"},
        "stream": True,
        "stream_options": {"include_usage": True},
    },
]
json_bodies = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=5)), inner, max_size=5)),
    max_leaves=20,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON value."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


@st.composite
def mutated(draw) -> dict:
    """A valid body with a few of its parts replaced, removed or added."""
    body = orjson.loads(orjson.dumps(draw(st.sampled_from(VALID))))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(body)))
        if not path:
            body[draw(st.sampled_from(FIELDS))] = draw(json_bodies)
            continue
        *head, last = path
        parent = body
        for step in head:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "replace", "delete", "empty"]))
        if action == "delete":
            del parent[last]
        elif action == "empty":
            parent[last] = type(parent[last])() if isinstance(parent[last], (dict, list, str)) else None
        else:
            parent[last] = draw(json_bodies)
    return body


raw_bodies = st.one_of(
    json_bodies.map(orjson.dumps),
    mutated().map(orjson.dumps),
    mutated().map(orjson.dumps),
    mutated().map(orjson.dumps),
    st.builds(lambda body, cut: orjson.dumps(body)[:cut], mutated(), st.integers(0, 200)),
    st.binary(max_size=64),
)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
async def fuzzed_proxy(upstream, start_proxy):
    upstream.script(Reply(Generation([Step("reasoning", "r", [score("r")]), Step("text", "ok", [score("ok")]),
                                      Step("finish", finish_reason="stop")])))
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "max_body_bytes": 16 * 1024}))
    recorder = Recorder()
    for name in ("aiohttp", "proxy"):
        logging.getLogger(name).addHandler(recorder)
    yield url, recorder
    for name in ("aiohttp", "proxy"):
        logging.getLogger(name).removeHandler(recorder)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=raw_bodies)
async def test_no_body_gets_a_500(fuzzed_proxy, http, body: bytes) -> None:
    url, recorder = fuzzed_proxy
    async with http.post(f"{url}/v1/responses", data=body, headers={"Content-Type": "application/json"}) as response:
        status, kind, raw = response.status, response.content_type, await response.read()
    assert status < 500, raw
    assert not recorder.records, [r.getMessage() for r in recorder.records]
    if status != 200:
        assert kind == "application/json", raw
        error = orjson.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    elif kind == "text/event-stream":
        events = parse_sse(raw)
        types = [event["type"] for event in events]
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL, types
        for event in events:
            SDK_EVENT.validate_python(event)
    else:
        # The openai SDK's model only: openresponses-types 2.4.0 cannot take an echoed json_schema.
        sdk.Response.model_validate(orjson.loads(raw))
