"""A fast fake SGLang chat-completions server for the benchmark: `python -m tests.bench.upstream --port P`.

Raw asyncio protocol (no web framework), so that it is not the bottleneck. Every answer is
precomputed bytes in SGLang 0.5's exact shape, rendered by `tests.fake_upstream.Generation`
(delta with every key incl. nulls, `logprobs.content` with one entry per chunk carrying
`top_logprobs` entries when asked, finish chunk with `matched_stop`, usage chunk, `[DONE]`),
sent with chunked transfer encoding as uvicorn does.

Knobs ride in the model name, which the proxy forwards untouched:
`bench:n=256,k=1,pace=50` = 256 text chunks, k chunks per write (1: one chunk per write;
k > 1: coalesced), pace in chunks per second per stream (0: as fast as the socket takes them).
A paced stream sends its role chunk and first write at once, then one write per interval;
paced streams share one timer per interval, in slots spread over it (SGLang's decode steps
likewise emit a token for many streams at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from dataclasses import dataclass
from functools import lru_cache

import orjson

from tests.fake_upstream import Generation, Step, score

_WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ",", " and", " then", " it", " runs", " away", "."]
_SLOTS = 10  # a pace's interval is split in this many timer slots


def no_delay(transport: asyncio.Transport) -> None:
    """Small writes go out at once, as aiohttp does for its own sockets."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True)
class Knobs:
    n: int = 64  # text chunks
    k: int = 1  # chunks per write
    pace: float = 0.0  # chunks per second per stream; 0 = as fast as possible


def model_name(n: int, k: int = 1, pace: float = 0) -> str:
    return f"bench:n={n},k={k},pace={pace:g}"


def parse_model(model: str) -> Knobs:
    _, _, spec = model.partition(":")
    values = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    return Knobs(int(values.get("n", 64)), max(1, int(values.get("k", 1))), float(values.get("pace", 0)))


def generation(n: int, top: int) -> Generation:
    steps = [Step("text", w, scores=[score(w, -0.25 - (i % 7) / 10, top=top)]) for i, w in enumerate(_WORDS[i % len(_WORDS)] for i in range(n))]
    return Generation([*steps, Step("finish", finish_reason="stop")], model="bench", id="bench0123456789abcdef", created=1750000000)


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@lru_cache(maxsize=256)
def stream_writes(n: int, k: int, logprobs: bool, top: int, usage: bool) -> tuple[bytes, ...]:
    """The body writes of one stream: the role chunk, then the rest k frames at a time; the
    last write ends the chunked body."""
    frames = [b"data: " + orjson.dumps(c) + b"\n\n" for c in generation(n, top).chunks(logprobs=logprobs, usage=usage)]
    frames.append(b"data: [DONE]\n\n")
    rest = frames[1:]
    writes = [_http_chunk(frames[0])] + [_http_chunk(b"".join(rest[i : i + k])) for i in range(0, len(rest), k)]
    writes[-1] += b"0\r\n\r\n"
    return tuple(writes)


@lru_cache(maxsize=64)
def completion_response(n: int, logprobs: bool, top: int) -> bytes:
    body = orjson.dumps(generation(n, top).completion(logprobs=logprobs))
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class Pacer:
    """One timer for every stream at one write interval; streams sit in slots across it."""

    def __init__(self, interval: float, pacers: dict) -> None:
        self.interval = interval
        self.slots: list[set[Conn]] = [set() for _ in range(_SLOTS)]
        self._next_slot = 0
        self._pacers = pacers
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, conn: Conn) -> set:
        slot = self.slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % _SLOTS
        slot.add(conn)
        return slot

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        step = self.interval / _SLOTS
        due = loop.time()
        j = 0
        while any(self.slots):
            due += step
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            for conn in list(self.slots[j]):
                conn.tick()
            j = (j + 1) % _SLOTS
        del self._pacers[self.interval]


class Conn(asyncio.Protocol):
    pacers: dict[float, Pacer] = {}

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.writes: tuple[bytes, ...] = ()
        self.next = 0
        self.paused = False
        self.slot: set | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        no_delay(transport)

    def connection_lost(self, exc) -> None:
        self._end()
        self.transport = None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.slot is None:
            self._pump()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path, _ = head.split(" ", 2)
            self.handle(method, path, body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/health":
            self.transport.write(_OK)
            return
        if method != "POST" or path != "/v1/chat/completions":
            self.transport.write(_NOT_FOUND)
            return
        request = orjson.loads(body)
        knobs = parse_model(request.get("model", ""))
        logprobs = request.get("logprobs") is True
        top = int(request.get("top_logprobs") or 0)
        if not request.get("stream"):
            self.transport.write(completion_response(knobs.n, logprobs, top))
            return
        usage = (request.get("stream_options") or {}).get("include_usage") is True
        self.writes = stream_writes(knobs.n, knobs.k, logprobs, top, usage)
        self.next = 1
        self.transport.write(_SSE_HEAD + self.writes[0])
        if knobs.pace > 0:
            # The first token comes with the end of prefill; the pace starts after it.
            self.tick()
            interval = knobs.k / knobs.pace
            pacer = self.pacers.get(interval) or self.pacers.setdefault(interval, Pacer(interval, self.pacers))
            self.slot = pacer.add(self)
        else:
            self._pump()

    def tick(self) -> None:
        """A paced stream's next write."""
        if self.transport is None or self.next >= len(self.writes):
            self._end()
            return
        self.transport.write(self.writes[self.next])
        self.next += 1
        if self.next >= len(self.writes):
            self._end()

    def _pump(self) -> None:
        """An unpaced stream: write until the transport asks to pause."""
        writes, transport = self.writes, self.transport
        while not self.paused and self.next < len(writes) and transport is not None:
            transport.write(writes[self.next])
            self.next += 1

    def _end(self) -> None:
        if self.slot is not None:
            self.slot.discard(self)
            self.slot = None


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    with contextlib.suppress(KeyboardInterrupt):
        (uvloop.run if uvloop else asyncio.run)(serve(args.host, args.port))


if __name__ == "__main__":
    main()
