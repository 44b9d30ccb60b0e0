"""Bad input over HTTP: each case gets the right status and the OpenAI error envelope
(naming `param` where a field is at fault), the upstream is never called, and the proxy goes
on serving, with nothing logged as an unhandled error."""

from __future__ import annotations

import gzip
import logging
import struct
import zlib
from typing import Any

import aiohttp
import orjson
import pytest
import zstandard
from aiohttp.web_protocol import RequestPayloadError

from proxy.config import parse
from tests.client import LOGPROBS, envelope, parse_sse, validate_response
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import handler_errors

GEN = Generation([Step("text", "ok", [score("ok")]), Step("finish", finish_reason="stop")])
BODY = {"model": "m", "input": "hi"}
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object"}}
LIMIT = 64 * 1024


@pytest.fixture
async def proxy(upstream, start_proxy) -> str:
    """The proxy with a small body limit; the upstream answers every request it gets."""
    upstream.script(Reply(GEN))  # the last scripted reply is repeated
    return await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url]}], "max_body_bytes": LIMIT}))


@pytest.fixture(autouse=True)
def no_unhandled_errors(caplog):
    """A handler that raised shows as an ERROR record of aiohttp or the proxy."""
    caplog.set_level(logging.WARNING)
    yield
    errors = [r for r in handler_errors(caplog.get_records("call")) if not lingering(r)]
    assert not errors, [r.getMessage() for r in errors]


def lingering(record: logging.LogRecord) -> bool:
    """aiohttp's own log line when, after the answer, it reads on into a request body that
    cannot be decoded (a lying gzip): not a handler's error."""
    return record.getMessage() == "Unhandled exception" and isinstance(record.exc_info and record.exc_info[1], RequestPayloadError)


async def refused(http, proxy: str, upstream, status: int, *, data: Any = None, json: Any = None, headers: dict | None = None) -> dict:
    """POST a bad request; its envelope. Then: the upstream was not called, and the proxy
    still answers a good request."""
    if json is not None:
        data, headers = orjson.dumps(json), {"Content-Type": "application/json", **(headers or {})}
    async with http.post(f"{proxy}/v1/responses", data=data, headers=headers or {}) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        error = envelope(await response.json(), type="invalid_request_error")
    assert upstream.requests == []
    async with http.post(f"{proxy}/v1/responses", json=BODY) as response:
        assert response.status == 200, await response.text()
    assert len(upstream.requests) == 1
    return error


# -- the body itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"model": "m", "input": ', id="truncated-json"),
        pytest.param(b"model=m&input=hi", id="form-encoded"),
        pytest.param(b"{'model': 'm'}", id="single-quotes"),
        pytest.param(b'{"model": "m", "input": "hi",}', id="trailing-comma"),
        pytest.param(b'{"model": "m", "input": "hi"} {}', id="two-documents"),
        pytest.param(b"\xff\xfe{\x00}\x00", id="utf16-bom"),
        pytest.param(b'{"model": "m", "input": "\\ud800"}', id="lone-surrogate"),
        pytest.param(b'{"model": "m", "input": "hi", "temperature": 1e999}', id="infinite-number"),
        pytest.param(b'{"model": "m", "input": "hi", "temperature": NaN}', id="nan"),
        pytest.param(b'{"model": "m", "input": "hi", "model": 5}', id="duplicate-key"),
        pytest.param(b"", id="empty-body"),
        pytest.param(b"   \n", id="whitespace-body"),
        pytest.param(b"[]", id="array"),
        pytest.param(b'[{"model": "m", "input": "hi"}]', id="array-of-request"),
        pytest.param(b'"hi"', id="string"),
        pytest.param(b"42", id="number"),
        pytest.param(b"null", id="null"),
        pytest.param(b"true", id="bool"),
        pytest.param(b"{}", id="empty-object"),
    ],
)
async def test_body_not_a_request(upstream, proxy, http, data: bytes) -> None:
    await refused(http, proxy, upstream, 400, data=data, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(("method", "path", "allowed"), [("PUT", "/v1/responses", "POST"), ("PUT", "/v1/models", "GET")])
async def test_a_method_not_allowed_says_which_are(upstream, proxy, http, method: str, path: str, allowed: str) -> None:
    """A 405 in the envelope, with the `Allow` header RFC 9110 asks for."""
    async with http.request(method, f"{proxy}{path}") as response:
        assert response.status == 405 and allowed in response.headers["Allow"].split(",")
        envelope(await response.json(), "method_not_allowed")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "text/event-stream", "application/jsonl"],
)
async def test_wrong_content_type_is_415(upstream, proxy, http, content_type: str) -> None:
    error = await refused(http, proxy, upstream, 415, data=orjson.dumps(BODY), headers={"Content-Type": content_type})
    assert error["code"] == "unsupported_media_type" and error["param"] is None


@pytest.mark.parametrize("headers", [{"Content-Type": "application/json; charset=utf-8"}, {"Content-Type": "APPLICATION/JSON"}, {}], ids=["charset", "upper", "none"])
async def test_json_content_types_accepted(upstream, proxy, http, headers: dict) -> None:
    async with http.post(f"{proxy}/v1/responses", data=orjson.dumps(BODY), headers=headers) as response:
        assert response.status == 200, await response.text()
        validate_response(await response.json())


def padded(size: int) -> bytes:
    """A valid request body of at least `size` bytes."""
    return orjson.dumps({**BODY, "input": "x" * size})


def lying_gzip(data: bytes, isize: int | None = None, crc: int | None = None) -> bytes:
    """gzip of `data` whose trailer claims another size (ISIZE) or checksum."""
    raw = bytearray(gzip.compress(data))
    if isize is not None:
        raw[-4:] = struct.pack("<I", isize)
    if crc is not None:
        raw[-8:-4] = struct.pack("<I", crc)
    return bytes(raw)


GZIP = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
ZSTD = {"Content-Type": "application/json", "Content-Encoding": "zstd"}


@pytest.mark.parametrize(
    ("data", "headers"),
    [
        pytest.param(padded(LIMIT), {"Content-Type": "application/json"}, id="plain"),
        pytest.param(gzip.compress(padded(LIMIT)), GZIP, id="gzip"),
        pytest.param(gzip.compress(padded(64 * LIMIT)), GZIP, id="gzip-bomb"),
        pytest.param(zlib.compress(padded(64 * LIMIT)), {"Content-Type": "application/json", "Content-Encoding": "deflate"}, id="deflate-bomb"),
        pytest.param(zstandard.compress(padded(64 * LIMIT)), ZSTD, id="zstd-bomb"),
        pytest.param(zstandard.ZstdCompressor(write_content_size=False).compress(padded(64 * LIMIT)), ZSTD, id="zstd-bomb-without-size"),
    ],
)
async def test_body_over_the_limit_is_413(upstream, proxy, http, data: bytes, headers: dict) -> None:
    """The limit holds for the decompressed size, however small the body on the wire."""
    error = await refused(http, proxy, upstream, 413, data=data, headers=headers)
    assert error["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("data", "statuses"),
    [
        pytest.param(lying_gzip(orjson.dumps(BODY), isize=3), {400}, id="isize-too-small"),
        pytest.param(lying_gzip(orjson.dumps(BODY), isize=2**32 - 1), {400}, id="isize-too-big"),
        pytest.param(lying_gzip(padded(64 * LIMIT), isize=100), {400, 413}, id="bomb-claiming-100-bytes"),
        pytest.param(lying_gzip(orjson.dumps(BODY), crc=0), {400}, id="bad-crc"),
        pytest.param(gzip.compress(orjson.dumps(BODY))[:-12], {400}, id="truncated"),
        pytest.param(orjson.dumps(BODY), {400}, id="not-gzip-at-all"),
        pytest.param(b"\x1f\x8b\x08\x00garbage", {400}, id="gzip-header-then-garbage"),
    ],
)
async def test_gzip_that_lies(upstream, proxy, http, data: bytes, statuses: set[int]) -> None:
    """A gzip body whose trailer or stream is not what it claims: a client error in the
    envelope (never a 500), and the size limit still holds."""
    # Connection: close, so that the check below does not race the server closing this one.
    async with http.post(f"{proxy}/v1/responses", data=data, headers={**GZIP, "Connection": "close"}) as response:
        assert response.status in statuses, await response.text()
        assert response.content_type == "application/json", await response.text()
        envelope(await response.json(), type="invalid_request_error")
    assert upstream.requests == []
    async with http.post(f"{proxy}/v1/responses", json=BODY) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(zstandard.compress(orjson.dumps(BODY)), 200, id="zstd"),
        pytest.param(zstandard.ZstdCompressor(write_content_size=False).compress(orjson.dumps(BODY)), 200, id="zstd-streamed-frame"),
        pytest.param(zstandard.compress(orjson.dumps(BODY))[:-4], 400, id="zstd-truncated"),
        pytest.param(zstandard.compress(orjson.dumps(BODY)) + b"trailing", 400, id="zstd-then-garbage"),
        pytest.param(orjson.dumps(BODY), 400, id="not-zstd-at-all"),
    ],
)
async def test_a_zstd_body(upstream, proxy, http, data: bytes, status: int) -> None:
    """design.md 5.8: Codex can send zstd bodies; one is read as strictly as gzip: whole, one
    frame and nothing after it, within the limit on what it inflates."""
    async with http.post(f"{proxy}/v1/responses", data=data, headers={**ZSTD, "Connection": "close"}) as response:
        assert response.status == status, await response.text()
        if status != 200:
            envelope(await response.json(), type="invalid_request_error")
    assert len(upstream.requests) == (status == 200)


# -- each field ---------------------------------------------------------------------------------



def case(param: str, id: str, **fields: Any):
    return pytest.param(fields, param, id=id)


def msg(content: Any, role: str = "user") -> dict:
    return {"type": "message", "role": role, "content": content}


FIELDS = [
    # model
    case("model", "model-int", model=5),
    case("model", "model-empty", model=""),
    case("model", "model-null", model=None),
    case("model", "model-list", model=["m"]),
    # input
    case("input", "input-int", input=5),
    case("input", "input-empty-string", input=""),
    case("input", "input-empty-list", input=[]),
    case("input", "input-object", input={"role": "user", "content": "hi"}),
    case("input", "input-null", input=None),
    case("input[0]", "input-item-string", input=["hi"]),
    case("input[0].type", "input-unknown-item-type", input=[{"type": "hologram", "id": "x"}]),
    case("input[0].type", "input-item-type-int", input=[{"type": 5, "role": "user", "content": "hi"}]),
    case("input[1].role", "input-unknown-role", input=[msg("a"), msg("b", role="moderator")]),
    case("input[0].content", "input-content-int", input=[msg(5)]),
    case("input[0].content", "input-content-missing", input=[{"role": "user"}]),
    case("input[0].content[0].type", "input-unknown-part", input=[msg([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])]),
    case("input[0].content[1].type", "input-unknown-second-part", input=[msg([{"type": "input_text", "text": "a"}, {"type": "input_video"}])]),
    case("input[0].content[0].text", "input-part-text-int", input=[msg([{"type": "input_text", "text": 5}])]),
    case("input[0].content[0]", "input-part-string", input=[msg(["hi"])]),
    case("input[0].call_id", "function_call-without-call_id", input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
    case("input[0].call_id", "function_call-empty-call_id", input=[{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]),
    case("input[0].arguments", "function_call-arguments-object", input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
    case("input[0].output", "function_call_output-int", input=[{"type": "function_call_output", "call_id": "c", "output": 5}]),
    # instructions, include
    case("instructions", "instructions-int", instructions=5),
    case("include", "include-string", include="message.output_text.logprobs"),
    case("include[0]", "include-unknown", include=["message.output_text.logprob"]),
    case("include[1]", "include-unknown-second", include=[*LOGPROBS, "everything"]),
    case("include[0]", "include-int", include=[5]),
    # top_logprobs (10**9 is valid: capped, see below)
    *(case("top_logprobs", f"top_logprobs-{v!r}", top_logprobs=v) for v in (-1, 1.5, "3", True, [3], {"k": 3})),
    # max_output_tokens, sampling
    *(case("max_output_tokens", f"max_output_tokens-{v!r}", max_output_tokens=v) for v in (0, -1, "5", 2.5)),
    *(case("temperature", f"temperature-{v!r}", temperature=v) for v in (-0.1, 2.01, "hot")),
    *(case("top_p", f"top_p-{v!r}", top_p=v) for v in (-0.1, 1.5)),
    case("presence_penalty", "presence_penalty-3", presence_penalty=3),
    case("frequency_penalty", "frequency_penalty--2.5", frequency_penalty=-2.5),
    # tools
    case("tools", "tools-object", tools={"type": "function", "name": "f"}),
    case("tools[0]", "tools-string", tools=["weather"]),
    case("tools[0].type", "tool-type-int", tools=[{"type": 5}]),
    case("tools[0].name", "custom-without-name", tools=[{"type": "custom"}]),
    case("tools[0].tools", "namespace-without-tools", tools=[{"type": "namespace", "name": "ns"}]),
    case("tools[0].tools[0].name", "namespace-member-without-name", tools=[{"type": "namespace", "name": "ns", "tools": [{"type": "function"}]}]),
    case("tools[0].name", "function-without-name", tools=[{"type": "function", "parameters": {"type": "object"}}]),
    case("tools[0].name", "function-empty-name", tools=[{"type": "function", "name": ""}]),
    case("tools[0].name", "function-name-with-spaces", tools=[{"type": "function", "name": "get weather"}]),
    case("tools[0].name", "function-name-int", tools=[{"type": "function", "name": 5}]),
    case("tools[0].parameters", "parameters-array", tools=[{"type": "function", "name": "f", "parameters": ["a"]}]),
    case("tools[0].parameters", "parameters-string", tools=[{"type": "function", "name": "f", "parameters": "{}"}]),
    case("tools[0].strict", "strict-string", tools=[{"type": "function", "name": "f", "strict": "yes"}]),
    # tool_choice
    case("tool_choice", "tool_choice-unknown-mode", tool_choice="sometimes"),
    case("tool_choice", "tool_choice-int", tool_choice=1),
    case("tool_choice.name", "tool_choice-undeclared", tools=[WEATHER], tool_choice={"type": "function", "name": "other"}),
    case("tool_choice.name", "tool_choice-no-tools", tool_choice={"type": "function", "name": "weather"}),
    case("tool_choice.name", "tool_choice-without-name", tools=[WEATHER], tool_choice={"type": "function"}),
    # text, reasoning
    case("text", "text-string", text="json"),
    case("text.format.schema", "json_schema-without-schema", text={"format": {"type": "json_schema", "name": "out"}}),
    case("text.format.schema", "json_schema-schema-string", text={"format": {"type": "json_schema", "name": "out", "schema": "{}"}}),
    case("text.format.type", "format-unknown", text={"format": {"type": "yaml"}}),
    case("reasoning.effort", "effort-int", reasoning={"effort": 5}),
    case("reasoning", "reasoning-string", reasoning="high"),
    # the rest
    case("parallel_tool_calls", "parallel_tool_calls-string", parallel_tool_calls="yes"),
    case("stream", "stream-string", stream="true"),
    case("stream", "stream-int", stream=1),
    case("stream_options", "stream_options-without-stream", stream_options={"include_usage": True}),
    case("stream_options", "stream_options-list", stream=True, stream_options=[1]),
    case("store", "store-string", store="no"),
    case("metadata", "metadata-list", metadata=["a"]),
    case("metadata", "metadata-value-int", metadata={"k": 5}),
    case("metadata", "metadata-value-too-long", metadata={"k": "x" * 513}),
    case("user", "user-int", user=5),
    case("service_tier", "service_tier-int", service_tier=1),
    case("previous_response_id", "previous_response_id", previous_response_id="resp_1"),
    case("max_tool_calls", "max_tool_calls-negative", max_tool_calls=-1),
    case("prompt", "prompt", prompt={"id": "pmpt_1"}),
    case("conversation", "conversation", conversation="conv_1"),
]


@pytest.mark.parametrize(("fields", "param"), FIELDS)
@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
async def test_field_refused(upstream, proxy, http, fields: dict, param: str, streaming: bool) -> None:
    body = {**BODY, **fields}
    if streaming and "stream_options" not in fields:
        body.setdefault("stream", True)
    error = await refused(http, proxy, upstream, 400, json=body)
    assert error["param"] == param, error


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("include", [True, False])
async def test_huge_top_logprobs_is_capped(upstream, proxy, http, streaming: bool, include: bool) -> None:
    """design.md 3.3: above the route cap (20) it is capped, sent and echoed as 20, not refused."""
    body = {**BODY, "top_logprobs": 10**9, "stream": streaming, **({"include": LOGPROBS} if include else {})}
    async with http.post(f"{proxy}/v1/responses", json=body) as response:
        assert response.status == 200, await response.text()
        final = parse_sse(await response.read())[-1]["response"] if streaming else await response.json()
    validate_response(final)
    assert final["top_logprobs"] == 20
    (sent,) = upstream.requests
    assert sent.get("top_logprobs") == (20 if include else None)


@pytest.mark.parametrize("bad", [123, {"x": 1}, True])
async def test_an_item_id_that_is_no_string_is_refused_where_it_would_be_lost(upstream: FakeUpstream, start_proxy, store: dict[str, Any], bad: Any) -> None:
    """design.md 8.2: an input item's id is kept and listed as a string; any other was answered
    200 and then never stored (a background one a 503, a conversation's item unreachable). A 400
    names it wherever items are sent: a response's input (over HTTP, in a conversation, over the
    WebSocket) and a conversation's items. A string id, or null, is kept as before."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": store}))
    item, fine = {"type": "message", "role": "user", "content": "hi", "id": bad}, {"role": "user", "content": "a"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/conversations", json={}) as made:
            conversation = (await made.json())["id"]
        for path, body, param in (
            ("/v1/responses", {"model": "m", "input": [item]}, "input[0].id"),
            ("/v1/responses", {"model": "m", "input": [fine, item], "background": True}, "input[1].id"),
            ("/v1/responses", {"model": "m", "input": [item], "conversation": conversation}, "input[0].id"),
            ("/v1/conversations", {"items": [item]}, "items[0].id"),
            (f"/v1/conversations/{conversation}/items", {"items": [fine, item]}, "items[1].id"),
        ):
            async with http.post(f"{url}{path}", json=body) as answer:
                assert answer.status == 400 and (await answer.json())["error"]["param"] == param, (path, body)
        async with http.ws_connect(f"{url}/v1/responses") as ws:
            await ws.send_json({"type": "response.create", "model": "m", "input": [item]})
            refused = await ws.receive_json()
            assert refused["status"] == 400 and refused["error"]["param"] == "input[0].id"
        kept = [{**item, "id": "msg_mine"}, {**item, "id": None}]
        async with http.post(f"{url}/v1/conversations/{conversation}/items", json={"items": kept}) as answer:
            ids = [added["id"] for added in (await answer.json())["data"]]
            assert answer.status == 200 and ids[0] == "msg_mine" and isinstance(ids[1], str)
        async with http.get(f"{url}/v1/conversations/{conversation}/items/msg_mine") as found:
            assert found.status == 200
    assert upstream.requests == []


@pytest.mark.parametrize(
    "metadata",
    [{f"k{n}": "v" for n in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}, [], False],
    ids=["17 pairs", "a long key", "a long value", "a number", "an empty list", "false"],
)
async def test_metadata_is_held_to_openais_limits(upstream: FakeUpstream, start_proxy, store: dict[str, Any], metadata: Any) -> None:
    """design.md 8.1: 16 pairs, keys up to 64 characters, string values up to 512, on responses
    and conversations alike (40,000 keys were kept as one 29 MB record); what is no object is
    refused, even when it is empty (`[]` and `false` were kept as `{}`)."""
    upstream.script(Reply(GEN))
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": store}))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/conversations", json={}) as made:
            conversation = (await made.json())["id"]
        for path, body in (
            ("/v1/responses", {"model": "m", "input": "hi", "metadata": metadata}),
            ("/v1/conversations", {"metadata": metadata}),
            (f"/v1/conversations/{conversation}", {"metadata": metadata}),
        ):
            async with http.post(f"{url}{path}", json=body) as answer:
                assert answer.status == 400, (path, await answer.text())
                assert (await answer.json())["error"]["param"] == "metadata"
        most = {f"k{n}": "v" * 512 for n in range(15)} | {"k" * 64: "v"}
        for path, body in (("/v1/responses", {"model": "m", "input": "hi", "metadata": most}), ("/v1/conversations", {"metadata": most})):
            async with http.post(f"{url}{path}", json=body) as answer:
                assert answer.status == 200 and (await answer.json())["metadata"] == most
