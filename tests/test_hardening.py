"""What an independent attack broke, each reproduced: log injection, leaked internals,
redirects, deep JSON, shutdown cuts, slow clients, compressed bodies, memory bounds."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import zlib
from collections.abc import Iterator

import aiohttp
import openai.types.responses as sdk
import openresponses_types.types as spec
import orjson
import pytest
from aiohttp import web

from proxy.config import parse
from proxy.logs import TextFormatter
from tests.client import envelope, eventually
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import BODY, free_port, post

# -- 1. log injection ------------------------------------------------------------------------------


async def test_a_client_cannot_forge_a_log_line(proxy: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    forged = "/health%0A2026-01-01%2000:00:00,000%20INFO%20proxy.access:%20POST%20/v1/responses%20200%1B[31m"
    with caplog.at_level(logging.INFO, logger="proxy.access"):
        async with http.get(f"{proxy}{forged}", headers={"X-Request-ID": "a\u2028b"}) as response:
            assert response.status == 404
            echoed = response.headers["X-Request-ID"]
    (record,) = [r for r in caplog.records if r.name == "proxy.access"]
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line
    assert "\\n2026-01-01" in line and "\\x1b[31m" in line
    assert echoed != "a\u2028b" and len(echoed) == 32  # replaced by an id of our own


def test_named_log_arguments_are_escaped_too() -> None:
    record = logging.LogRecord("proxy", logging.INFO, __file__, 1, "%(path)s served", ({"path": "/a\nforged line"},), None)
    assert TextFormatter().format(record).endswith(" /a\\nforged line served")


@pytest.mark.parametrize("sent", ["x" * 129, "id with spaces", "", "<script>"])
async def test_request_ids_are_bounded(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, sent: str) -> None:
    async with http.get(f"{proxy}/health", headers={"X-Request-ID": sent}) as response:
        assert response.headers["X-Request-ID"] != sent
    async with http.get(f"{proxy}/health", headers={"X-Request-ID": "req-42.a:b_c"}) as response:
        assert response.headers["X-Request-ID"] == "req-42.a:b_c"


# -- 2. internals stay in the log ------------------------------------------------------------------

SECRET_BODY = (
    b'{"object": "error", "message": "Traceback (most recent call last):\\n  File \\"/srv/sglang/engine.py\\"\\n'
    b'OperationalError: could not connect to postgres://admin:hunter2@db-internal.corp:5432/jobs", "code": 500}'
)
SECRETS = ("hunter2", "db-internal", "Traceback", "/srv/sglang")


def shows_no_secret(text: str) -> None:
    assert not [secret for secret in SECRETS if secret in text], text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_upstream_5xx_body_stays_in_the_log(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    upstream.script(Reply(status=500, body=SECRET_BODY))
    with caplog.at_level(logging.WARNING, logger="proxy"):
        async with http.post(f"{proxy}/v1/responses", json={**BODY, "stream": stream}) as response:
            text = await response.text()
            request_id = response.headers["X-Request-ID"]
    assert response.status == 502
    shows_no_secret(text)
    assert envelope(orjson.loads(text), "server_error")["message"] == f"upstream error (server_error); request id {request_id}"
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == request_id and "hunter2" in r.getMessage()]
    assert len(logged) == 1


async def test_an_upstream_error_frame_mid_stream_stays_in_the_log(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    frame = b"data: " + SECRET_BODY.replace(b'"object": "error", ', b"").join([b'{"error": ', b"}"]) + b"\n\n"
    gen = Generation([Step("text", "Hi", [score("Hi")]), Step("finish", finish_reason="stop")])
    upstream.script(Reply(gen, extra_frames=[frame]), Reply(gen, extra_frames=[frame.replace(b'"code": 500', b'"code": 400')]))
    with caplog.at_level(logging.WARNING, logger="proxy"):
        async with http.post(f"{proxy}/v1/responses", json={**BODY, "stream": True}) as response:
            raw = (await response.read()).decode()
    shows_no_secret(raw)
    assert "upstream error (server_error); request id" in raw
    assert any("hunter2" in r.getMessage() for r in caplog.records)
    # A 4xx frame is the request's own fault: its words are relayed.
    async with http.post(f"{proxy}/v1/responses", json={**BODY, "stream": True}) as response:
        assert "hunter2" in (await response.read()).decode()


async def test_an_unreachable_upstream_names_no_replica(start_proxy, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    dead = [f"http://127.0.0.1:{free_port()}/internal-path" for _ in range(2)]
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": dead}]}))
    with caplog.at_level(logging.WARNING, logger="proxy"):
        status, _, raw = await post(http, url, BODY)
    assert status == 502
    error = envelope(orjson.loads(raw), "upstream_unreachable")
    assert "127.0.0.1" not in error["message"] and "internal-path" not in error["message"]
    assert any(dead[0] in r.getMessage() and dead[1] in r.getMessage() for r in caplog.records)


# -- 3. redirects are not followed -----------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_a_redirect_is_not_followed(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, status: int, path: str) -> None:
    elsewhere = FakeUpstream()
    await elsewhere.start()
    try:
        upstream.script(Reply(status=status, body=b"", headers={"Location": f"{elsewhere.url}/v1/chat/completions"}))
        body = BODY if path == "/v1/responses" else {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{proxy}{path}", json=body) as response:
            assert response.status == 502
            envelope(await response.json(), "upstream_protocol_error")
        assert elsewhere.requests == []
    finally:
        await elsewhere.close()


# -- 4. malformed requests: no key in the log, no flood ---------------------------------------------


async def raw_request(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_a_malformed_request_is_one_short_line_without_its_headers(proxy: str, caplog: pytest.LogCaptureFixture) -> None:
    head = b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-live-secret\x01\r\nContent-Length: 2\r\n\r\n{}"
    with caplog.at_level(logging.DEBUG):
        answers = [await raw_request(proxy, head) for _ in range(30)]
    assert all(answer.split(b"\r\n")[0].endswith(b" 400 Bad Request") for answer in answers)
    lines = [TextFormatter().format(r) for r in caplog.records if r.name.startswith(("aiohttp", "proxy"))]
    assert not [line for line in lines if "sk-live-secret" in line or "Traceback" in line]
    malformed = [line for line in lines if "malformed request" in line]
    assert 1 <= len(malformed) <= 2 and all("\n" not in line and len(line) < 200 for line in malformed)


# -- 5. deeply nested JSON ---------------------------------------------------------------------


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("levels", [63, 120])  # 2 levels each, past the default 128
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_deeply_nested_json_is_a_400_naming_the_field(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, levels: int, stream: bool) -> None:
    body = {**BODY, "stream": stream, "tools": [{"type": "function", "name": "f", "parameters": nested(levels)}]}
    status, kind, raw = await post(http, proxy, body)
    assert (status, kind) == (400, "application/json"), raw
    assert envelope(orjson.loads(raw))["param"] == "tools[0].parameters"
    assert upstream.requests == []


async def test_json_deeper_than_any_parser_allows_is_a_400(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    deep = b'{"model": "m", "input": "hi", "metadata": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001
    async with http.post(f"{proxy}/v1/responses", data=deep, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        envelope(await response.json())
    assert upstream.requests == []


async def test_a_deep_but_real_schema_passes(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(Generation([Step("text", "ok"), Step("finish", finish_reason="stop")])))
    body = {**BODY, "tools": [{"type": "function", "name": "f", "parameters": nested(30)}]}
    status, _, raw = await post(http, proxy, body)
    assert status == 200, raw


async def test_the_chat_relay_refuses_deep_json_too(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "routes": [{"model": "m", "upstream": "u", "rewrite_model": "real"}]}))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": nested(250)}}]}
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 400 and response.content_type == "application/json"
        assert envelope(await response.json())["param"] == "tools[0].function"
    assert upstream.requests == []


# -- 12. compressed request bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "encoding", "status"),
    [
        pytest.param(gzip.compress(orjson.dumps(BODY))[:-8], "gzip", 400, id="gzip-without-trailer"),
        pytest.param(gzip.compress(orjson.dumps(BODY)) + b"trailing", "gzip", 400, id="gzip-then-garbage"),
        pytest.param(orjson.dumps(BODY), "foo", 415, id="unknown-encoding"),
        pytest.param(orjson.dumps(BODY), "br", 415, id="brotli"),
        pytest.param(orjson.dumps(BODY), "zstd", 400, id="zstd-that-is-not"),
    ],
)
async def test_a_compressed_body_is_read_strictly(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, data: bytes, encoding: str, status: int) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with http.post(f"{proxy}/v1/responses", data=data, headers=headers) as response:
        assert response.status == status, await response.text()
        envelope(await response.json(), type="invalid_request_error")
    assert upstream.requests == []


async def test_a_body_that_stops_coming_is_a_408(upstream: FakeUpstream, start_proxy) -> None:
    """A body trickled in holds a connection: it must arrive within `body_timeout` (design.md 5.11)."""
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "connections": {"body_timeout": 0.3}}))
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    try:
        async with asyncio.timeout(5):
            status_line = await reader.readline()
        assert status_line.split()[1] == b"408", status_line
        assert upstream.requests == []
    finally:
        writer.close()


async def test_data_after_a_gzip_body_is_refused_as_it_arrives(proxy: str) -> None:
    """Bytes past the end of the compressed stream are not read on (they would be held
    uncounted, design.md 5.8): the 400 comes while the client is still sending."""
    host, port = proxy.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    first = gzip.compress(orjson.dumps(BODY)) + b"more" * 1024
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(first), first)
    )
    try:
        async with asyncio.timeout(5):  # the body never ends: only an answer on what came helps
            status_line = await reader.readline()
        assert status_line.split()[1] == b"400", status_line
    finally:
        writer.close()


async def test_gzip_and_deflate_bodies_are_read(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    upstream.script(Reply(Generation([Step("text", "ok"), Step("finish", finish_reason="stop")])))
    for data, encoding in ((gzip.compress(orjson.dumps(BODY)), "gzip"), (zlib.compress(orjson.dumps(BODY)), "deflate")):
        async with http.post(f"{proxy}/v1/responses", data=data, headers={"Content-Type": "application/json", "Content-Encoding": encoding}) as response:
            assert response.status == 200, await response.text()


# -- 11. the model list of an upstream without one -----------------------------------------------------


async def test_an_upstream_model_list_is_read_within_the_answer_limit(start_proxy, http: aiohttp.ClientSession) -> None:
    app = web.Application()

    async def huge(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m" * 1000, "object": "model"}] * 10})

    app.router.add_get("/v1/models", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        upstream = {"name": "u", "urls": [f"http://127.0.0.1:{runner.addresses[0][1]}"], "max_answer_bytes": 5000}
        url = await start_proxy(parse({"upstreams": [upstream]}))
        async with http.get(f"{url}/v1/models") as response:
            assert response.status == 502 and envelope(await response.json(), "upstream_protocol_error")
    finally:
        await runner.cleanup()


async def test_an_upstream_html_404_for_models_is_an_envelope(start_proxy, http: aiohttp.ClientSession) -> None:
    app = web.Application()
    async def not_found(_: web.Request) -> web.Response:
        return web.Response(status=404, text="<html><body>Not Found</body></html>", content_type="text/html")

    app.router.add_get("/v1/models", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [f"http://127.0.0.1:{runner.addresses[0][1]}"]}]}))
        async with http.get(f"{url}/v1/models") as response:
            assert response.status == 502 and response.content_type == "application/json"
            assert "<html>" not in envelope(await response.json(), "upstream_protocol_error")["message"]
    finally:
        await runner.cleanup()


# -- also: the echoed strict flag of a JSON schema ----------------------------------------------------


@pytest.mark.parametrize(("sent", "echoed"), [({}, False), ({"strict": True}, True), ({"strict": False}, False)])
async def test_json_schema_strict_is_echoed_as_a_bool(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession, sent: dict, echoed: bool) -> None:
    upstream.script(Reply(Generation([Step("text", "{}"), Step("finish", finish_reason="stop")])))
    text = {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, **sent}}
    status, _, raw = await post(http, proxy, {**BODY, "text": text})
    assert status == 200
    response = orjson.loads(raw)
    assert response["text"]["format"]["strict"] is echoed
    sdk.Response.model_validate(response)
    # openresponses-types 2.4 types a format's `schema` as None (its bug): the rest must hold.
    spec.JsonSchemaResponseFormat.model_validate({**response["text"]["format"], "schema": None})


# -- 9. compressed upstream answers ------------------------------------------------------------------


async def test_configured_upstream_headers_cannot_ask_for_compression(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    """The proxy reads answers as they come (design.md 6.10): an operator's headers are sent,
    but identity stays what it asks for."""
    headers = {"Accept-Encoding": "gzip", "X-Team": "search"}
    url = await start_proxy(parse({"upstreams": [{"name": "u", "urls": [upstream.url], "headers": headers}]}))
    upstream.script(Reply(Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")])))
    status, _, _ = await post(http, url, BODY)
    assert status == 200 and upstream.headers[-1]["accept-encoding"] == "identity" and upstream.headers[-1]["x-team"] == "search"


async def test_the_proxy_asks_for_identity_and_relays_an_encoding_it_gets_anyway(
    upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession
) -> None:
    completion = Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")]).completion()
    compressed = Reply(status=200, body=gzip.compress(orjson.dumps(completion)), headers={"Content-Encoding": "gzip"})
    upstream.script(compressed)
    async with http.post(f"{proxy}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as response:
        assert response.status == 200 and response.headers["Content-Encoding"] == "gzip"
        assert (await response.json())["choices"][0]["message"]["content"] == "Hi"  # aiohttp decoded it
    assert upstream.headers[-1]["accept-encoding"] == "identity"
    for stream in (False, True):
        upstream.script(compressed)
        status, _, raw = await post(http, proxy, {**BODY, "stream": stream})
        assert status == 502 and envelope(orjson.loads(raw), "upstream_protocol_error")


# -- 10. memory bounds -------------------------------------------------------------------------------


async def test_a_non_streaming_answer_over_the_limit_is_refused(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url], "max_answer_bytes": 4096}]}))
    long = Generation([Step("text", "x" * 10_000), Step("finish", finish_reason="stop")])
    upstream.script(Reply(long))
    status, _, raw = await post(http, url, BODY)
    assert status == 502 and envelope(orjson.loads(raw), "upstream_protocol_error")


async def test_an_endless_sse_line_fails_the_stream_at_the_limit(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url], "max_event_bytes": 64 * 1024}]}))
    sent = 0

    def endless() -> Iterator[bytes]:
        nonlocal sent
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
        while sent < 64 * 1024 * 1024:  # would be 64 MiB unbounded
            sent += 16 * 1024
            yield b"x" * 16 * 1024

    upstream.script(Reply(frames=endless()))
    async with http.post(f"{url}/v1/responses", json={**BODY, "stream": True}) as response:
        raw = await response.read()
    assert b"response.failed" in raw and b"upstream_protocol_error" in raw
    assert sent < 16 * 1024 * 1024  # it stopped reading soon after the limit (socket buffers hold the rest)


async def test_a_20k_token_answer_with_20_alternatives_passes(upstream: FakeUpstream, proxy: str, http: aiohttp.ClientSession) -> None:
    steps = [Step("text", f"w{i % 10}", [score(f"w{i % 10}", top=20)]) for i in range(20_000)]
    upstream.script(Reply(Generation([*steps, Step("finish", finish_reason="stop")])))
    status, _, raw = await post(http, proxy, {**BODY, "include": ["message.output_text.logprobs"], "top_logprobs": 20}, seconds=60)
    assert status == 200, raw[:300]
    assert len(orjson.loads(raw)["output"][0]["content"][0]["logprobs"]) == 20_000


# -- 7. clients that stop reading ------------------------------------------------------------------

# A stream far larger than the socket buffers between the proxy and a client that reads nothing.
FLOOD = Generation([*(Step("text", "x" * 8192) for _ in range(2000)), Step("finish", finish_reason="stop")])


# Each streaming endpoint with a request it streams: translated, and relayed as it came.
STREAMED = [("/v1/responses", BODY), ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})]


async def silent_reader(url: str, body: dict, path: str = "/v1/responses") -> asyncio.StreamWriter:
    """A client that sends a streaming request and never reads a byte of the answer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    _, writer = await asyncio.open_connection(sock=sock)
    data = orjson.dumps({**body, "stream": True})
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return writer


@pytest.mark.parametrize(("path", "body"), STREAMED, ids=["responses", "chat-relay"])
async def test_silent_readers_are_let_go_and_a_full_pool_says_so(upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession, path: str, body: dict) -> None:
    # The wait for a pooled connection (connect) ends before the silent readers are let go
    # (client_idle); 0.3 s, then 1 s, to connect failed a reader on a loaded machine (its
    # connection to the fake upstream, which shares this event loop with the floods).
    timeouts = {"client_idle": 4.0, "connect": 2.0}
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url], "max_connections": 3, "timeouts": timeouts}]}))
    upstream.choose = lambda _: Reply(FLOOD)
    readers = [await silent_reader(url, body, path) for _ in range(3)]
    await eventually(lambda: upstream.active_streams == 3)
    # The pool is full: a clear 503, not a timeout blamed on the upstream.
    status, _, raw = await post(http, url, BODY)
    assert status == 503 and envelope(orjson.loads(raw), "upstream_busy")["message"].startswith("All 3 connections")
    # Past client_idle the silent readers are let go, and their upstream requests with them.
    await eventually(lambda: upstream.disconnects == 3, timeout=10)
    upstream.choose = None
    upstream.script(Reply(Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")])))
    status, _, raw = await post(http, url, BODY)
    assert status == 200, raw
    for writer in readers:
        writer.close()


@pytest.mark.parametrize(("path", "body"), STREAMED, ids=["responses", "chat-relay"])
async def test_total_bounds_an_exchange_blocked_on_a_slow_client(upstream: FakeUpstream, start_proxy, path: str, body: dict) -> None:
    url = await start_proxy(parse({"upstreams": [{"name": "default", "urls": [upstream.url], "timeouts": {"total": 1.0, "client_idle": 60}}]}))
    upstream.script(Reply(FLOOD))
    started = asyncio.get_running_loop().time()
    writer = await silent_reader(url, body, path)
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    assert asyncio.get_running_loop().time() - started < 3
    writer.close()
