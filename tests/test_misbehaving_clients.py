"""Clients that misbehave: a client that hangs up at any stage has its upstream
request cancelled within a second, and leaves no held or broken pooled connection and no
task behind; a client that stops reading gets backpressure, not a proxy that buffers the
whole stream in memory."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from tests.client import read_events
from tests.events import TERMINAL, check_stream, sent_scores
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import BODY, Running, handler_errors, healthy, rss, settled, turn


@pytest.fixture(autouse=True)
def no_handler_errors(caplog):
    """A client that hangs up is not an error of the proxy's: nothing logged as one."""
    caplog.set_level(logging.WARNING)
    yield
    errors = handler_errors(caplog.get_records("call"))
    assert not errors, [r.getMessage() for r in errors]


def reasoning_then_text(steps: int = 40) -> Generation:
    return Generation(
        [Step("reasoning", f"r{i} ", [score(f"r{i}")]) for i in range(steps)]
        + [Step("text", f"t{i} ", [score(f"t{i}")]) for i in range(steps)]
        + [Step("tool", '{"a": 1}', [score("{")], tool_id="call_1", tool_name="f")]
        + [Step("finish", finish_reason="tool_calls")]
    )


GEN = reasoning_then_text()
FIRST_TEXT = 1 + 40  # the index of the first text chunk in GEN.chunks()

STAGES = {
    # stage: (the event the client hangs up after, how the upstream paces the stream)
    "reasoning-stalled": ("response.reasoning_text.delta", dict(stall_after=3)),
    "reasoning-paced": ("response.reasoning_text.delta", dict(delay=0.02)),
    "text-stalled": ("response.output_text.delta", dict(stall_after=FIRST_TEXT + 2)),
    "text-paced": ("response.output_text.delta", dict(delay=0.01)),
    "tool-call-stalled": ("response.function_call_arguments.delta", dict(stall_after=2 * 40 + 2)),
}


@pytest.mark.parametrize("stage", list(STAGES))
async def test_hang_up_mid_stream_cancels_the_upstream(upstream: FakeUpstream, launch, http, baseline, stage: str) -> None:
    running = await launch()
    until, pacing = STAGES[stage]
    upstream.script(Reply(GEN, **pacing))
    async with http.post(f"{running.url}/v1/responses", json={**BODY, "stream": True}) as response:
        seen = [event["type"] async for event in _until(read_events(response), until)]
        response.close()
    assert seen[-1] == until and not set(seen) & set(TERMINAL)
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)
    assert upstream.disconnects == 1
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)
    assert upstream.disconnects == 1


async def _until(stream, kind: str):
    async for event in stream:
        yield event
        if event["type"] == kind:
            return


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "stream"])
async def test_hang_up_before_the_upstream_answers(upstream: FakeUpstream, launch, http, baseline, streaming: bool) -> None:
    running = await launch()
    upstream.script(Reply(turn(), headers_delay=60))
    request = asyncio.create_task(http.post(f"{running.url}/v1/responses", json={**BODY, "stream": streaming}))
    while not upstream.requests:
        await asyncio.sleep(0.01)
    request.cancel()  # aiohttp closes the connection of a request it gives up
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)
    assert upstream.disconnects == 1
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


async def test_hang_up_while_a_plain_answer_is_half_sent(upstream: FakeUpstream, launch, http, baseline) -> None:
    running = await launch()
    upstream.script(Reply(turn(), body_stall_after=30))
    request = asyncio.create_task(http.post(f"{running.url}/v1/responses", json=BODY))
    while not upstream.requests:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # the proxy is reading the body by now
    request.cancel()
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


@pytest.mark.parametrize("read_done", [False, True], ids=["before-done", "after-done"])
async def test_hang_up_after_completed(upstream: FakeUpstream, launch, http, baseline, read_done: bool) -> None:
    """The generation is over: nothing to cancel, and the upstream connection goes back to
    the pool whole (the upstream saw no hang-up)."""
    running = await launch()
    upstream.script(Reply(turn()))
    async with http.post(f"{running.url}/v1/responses", json={**BODY, "stream": True}) as response:
        seen = [event async for event in _until(read_events(response), "response.completed")]
        if read_done:
            assert await response.content.read() == b""
        response.close()
    check_stream(seen)
    await settled(running, upstream, baseline)
    assert upstream.disconnects == 0 and len(running.pooled()) == 1
    await healthy(http, running, upstream)
    assert upstream.disconnects == 0


async def test_many_hang_ups_at_once(upstream: FakeUpstream, launch, http, baseline) -> None:
    """Thirty streams at different stages, all abandoned together."""
    running = await launch()
    upstream.choose = lambda chat: Reply(GEN, stall_after=int(chat["messages"][-1]["content"]))
    cuts = [2 + (n * 3) % (2 * 40) for n in range(30)]

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as many:
        await asyncio.gather(*(abandon(many, running, cut) for cut in cuts))
    deadline = asyncio.get_running_loop().time() + 2.0
    while upstream.disconnects < len(cuts):
        assert asyncio.get_running_loop().time() < deadline, upstream.disconnects
        await asyncio.sleep(0.02)
    upstream.choose = None
    await settled(running, upstream, baseline)
    await healthy(http, running, upstream)


async def abandon(http: aiohttp.ClientSession, running: Running, cut: int) -> None:
    async with http.post(f"{running.url}/v1/responses", json={**BODY, "input": str(cut), "stream": True}) as response:
        async for event in read_events(response):
            if event["type"] in ("response.reasoning_text.delta", "response.output_text.delta"):
                break
        response.close()


# -- a slow reader --------------------------------------------------------------------------------

PIECE = 16 * 1024
PIECES = 1536  # 24 MiB of text


class Source:
    """The upstream stream, made as it is pulled: the fake's memory stays flat, and `pulled`
    shows how far the proxy has read."""

    def __init__(self) -> None:
        self.pulled = 0
        self.chunks = [*Generation([Step("text", "", [score("x")]), Step("finish", finish_reason="stop")]).chunks()]

    def text(self, n: int) -> str:
        return f"{n:08d}".ljust(PIECE, "abcdefgh"[n % 8])

    def __iter__(self) -> Iterator[bytes]:
        head, piece, finish, usage = self.chunks
        yield b"data: " + orjson.dumps(head) + b"\n\n"
        for n in range(PIECES):
            self.pulled = n + 1
            piece["choices"][0]["delta"]["content"] = self.text(n)
            yield b"data: " + orjson.dumps(piece) + b"\n\n"
        yield b"data: " + orjson.dumps(finish) + b"\n\ndata: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"


def small_socket(addr_info) -> socket.socket:
    family, type_, proto, *_ = addr_info
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock


async def test_slow_reader_gets_backpressure(upstream: FakeUpstream, launch, baseline) -> None:
    running = await launch()
    source = Source()
    upstream.script(Reply(frames=source))
    connector = aiohttp.TCPConnector(socket_factory=small_socket)
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(f"{running.url}/v1/responses", json={**BODY, "stream": True}) as response:
            reader = read_events(response)
            first = [event async for event in _until(reader, "response.output_text.delta")]
            assert first[-1]["delta"] == source.text(0)
            gc.collect()
            before = rss()
            # Paused: wait until the upstream is no longer being read.
            last, still = -1, 0
            while still < 5:
                await asyncio.sleep(0.1)
                still = still + 1 if source.pulled == last else 0
                last = source.pulled
            grown = rss() - before
            held = source.pulled * PIECE
            assert held < PIECES * PIECE * 2 / 3, f"{held >> 20} MiB pulled from the upstream while the client read nothing"
            assert grown < 16 * 2**20, f"RSS grew {grown >> 20} MiB while the client read nothing"
            # Then it reads everything, and every byte is there, in order.
            n, terminal = 1, None
            async for event in reader:
                if event["type"] == "response.output_text.delta":
                    assert event["delta"] == source.text(n)
                    n += 1
                elif event["type"] in TERMINAL:
                    terminal = event
        assert n == PIECES
        assert terminal["type"] == "response.completed"
        part = terminal["response"]["output"][0]["content"][0]
        assert len(part["text"]) == PIECES * PIECE
        assert part["logprobs"] == sent_scores([source.chunks[1]]) * PIECES
    await settled(running, upstream, baseline)


# -- a client that half-closes ----------------------------------------------------------------------

WIDE = Generation([Step("text", "x" * 32768, [score("x")]) for _ in range(400)] + [Step("finish", finish_reason="stop")])


async def test_half_close_with_unsent_data(upstream: FakeUpstream, launch, baseline, caplog) -> None:
    """The client shuts its sending side while the proxy still holds unsent bytes for it:
    aiohttp marks the connection closing but keeps it until those bytes go, so the handler
    is not cancelled and its next write finds a closing transport. The proxy must treat that
    as the client gone (upstream cancelled, nothing logged as an error), like any hang-up."""
    running = await launch()
    upstream.script(Reply(WIDE, delay=0.02))
    host, port = running.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # so the proxy's bytes queue up
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    _, writer = await asyncio.open_connection(sock=sock)
    body = orjson.dumps({**BODY, "stream": True})
    head = f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    async with asyncio.timeout(10):  # until the proxy has bytes queued for this client
        while not any(h.transport is not None and h.transport.get_write_buffer_size() for h in running.runner.server.connections):
            await asyncio.sleep(0.005)
    writer.write_eof()
    await asyncio.wait_for(upstream.disconnected.wait(), 1.0)
    writer.close()
    await settled(running, upstream, baseline)
    errors = [r for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    assert not errors, [f"{r.getMessage()}: {r.exc_info and r.exc_info[1]!r}" for r in errors]
