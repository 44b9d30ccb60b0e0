"""The load client: one driver for every side (direct, baseline, proxy), and the checks that a
measured stream really carried what it should (so a broken proxy can't post a good number)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson

from .client import Client
from .procs import Proc, core_busy_seconds
from .upstream import model_name

TOP_LOGPROBS = 5
STREAM_TIMEOUT = 120.0
PROMPT = "Write a short story about a fox."


@dataclass
class Side:
    """One way to reach the upstream: its port, its request bodies, and what marks a text event."""

    name: str
    port: int
    responses_api: bool  # the proxy: /v1/responses; else a chat-completions endpoint
    proc: Proc | None = None  # the process whose CPU and RSS it reports (direct: the upstream's)
    cpu: int | None = None  # the core it is pinned to
    host: str = "127.0.0.1"
    # Responses request fields: by default the translation alone, against the pass-through;
    # what keeping a response costs (store, background) is measured on its own (7, 8).
    options: dict = field(default_factory=lambda: {"store": False})

    @property
    def path(self) -> str:
        return "/v1/responses" if self.responses_api else "/v1/chat/completions"

    def client(self) -> Client:
        return Client(self.host, self.port)

    @property
    def marker(self) -> bytes:
        # One per text event: a Responses delta event, or a chat chunk that carries scores
        # (SGLang writes `"logprobs":null` on the others).
        return b"event: response.output_text.delta\n" if self.responses_api else b'"logprobs":{"content"'

    def body(self, n: int, *, stream: bool, k: int = 1, pace: float = 0) -> bytes:
        model = model_name(n, k, pace)
        if self.responses_api:
            body = {"model": model, "input": PROMPT, "stream": stream, "include": ["message.output_text.logprobs"], "top_logprobs": TOP_LOGPROBS, **self.options}
        else:
            body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": stream, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
            if stream:
                body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)

    def check(self, body: bytes, n: int, *, stream: bool) -> str | None:
        try:
            if self.responses_api:
                return check_responses_stream(body, n) if stream else check_response(orjson.loads(body), n)
            return check_chat_stream(body, n) if stream else check_chat_completion(orjson.loads(body), n)
        except Exception as exc:  # a body that does not even parse
            return f"unreadable body: {exc!r}"


def _score_error(scores: list, n: int) -> str | None:
    if len(scores) != n:
        return f"{len(scores)} scores, expected {n}"
    if any(len(s.get("top_logprobs") or ()) != TOP_LOGPROBS for s in scores):
        return f"a score without {TOP_LOGPROBS} top_logprobs"
    return None


def check_chat_stream(body: bytes, n: int) -> str | None:
    frames = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    if not frames or frames[-1] != b"[DONE]":
        return "no [DONE]"
    chunks = [orjson.loads(f) for f in frames[:-1]]
    scores = [s for c in chunks for ch in c["choices"] for s in ((ch.get("logprobs") or {}).get("content") or ())]
    if not any(c.get("usage") for c in chunks):
        return "no usage chunk"
    return _score_error(scores, n)


def check_chat_completion(body: dict, n: int) -> str | None:
    return _score_error(body["choices"][0]["logprobs"]["content"], n)


def check_responses_stream(body: bytes, n: int) -> str | None:
    events = []
    for block in body.split(b"\n\n"):
        data = next((line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")), None)
        if data is not None and data != b"[DONE]":
            events.append(orjson.loads(data))
    if [e["sequence_number"] for e in events] != list(range(len(events))):
        return "sequence numbers not consecutive"
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    if len(deltas) != n:
        return f"{len(deltas)} text deltas, expected {n}"
    if error := _score_error([s for d in deltas for s in d["logprobs"]], n):
        return f"deltas: {error}"
    if events[-1]["type"] != "response.completed":
        return f"ended with {events[-1]['type']}"
    return check_response(events[-1]["response"], n)


def check_response(response: dict, n: int) -> str | None:
    if response["status"] != "completed":
        return f"status {response['status']}"
    part = response["output"][-1]["content"][0]
    if error := _score_error(part["logprobs"], n):
        return f"response: {error}"
    if response["usage"]["output_tokens"] != n:
        return f"usage.output_tokens {response['usage']['output_tokens']}"
    return None


@dataclass
class StreamResult:
    events: int = 0
    first: float | None = None  # seconds from the request to the first text event
    total: float = 0.0  # seconds from the request to the end of the stream
    max_gap: float = 0.0  # longest wait between two text events
    error: str | None = None
    body: bytes | None = None


async def stream_once(client: Client, side: Side, body: bytes, keep: bool = False) -> StreamResult:
    """One stream: text events counted per read as they arrive (the marker may straddle reads)."""
    marker = side.marker
    edge = len(marker) - 1
    result = StreamResult()
    parts: list[bytes] = []
    tail = b""
    started = last = time.perf_counter()

    def on_read(pieces: list[bytes]) -> None:
        nonlocal tail, last
        count = 0
        for piece in pieces:
            count += piece.count(marker) + (tail + piece[:edge]).count(marker)
            tail = piece[-edge:] if len(piece) >= edge else (tail + piece)[-edge:]
        if keep:
            parts.extend(pieces)
        if count:
            now = time.perf_counter()
            if result.first is None:
                result.first = now - started
            elif now - last > result.max_gap:
                result.max_gap = now - last
            last = now
            result.events += count

    try:
        async with asyncio.timeout(STREAM_TIMEOUT):
            status = await client.post(side.path, body, on_read)
        result.total = time.perf_counter() - started
        if status != 200:
            result.error = f"HTTP {status}"
    except (OSError, TimeoutError) as exc:
        result.error = repr(exc)
    if keep:
        result.body = b"".join(parts)
    return result


async def call_once(client: Client, side: Side, body: bytes) -> tuple[float, bytes]:
    """A non-streaming call: seconds to the whole answer, and the answer."""
    parts: list[bytes] = []
    started = time.perf_counter()
    status = await client.post(side.path, body, parts.extend)
    elapsed = time.perf_counter() - started
    data = b"".join(parts)
    if status != 200:
        raise RuntimeError(f"{side.name}: HTTP {status}: {data[:200]!r}")
    return elapsed, data


async def latencies(client: Client, side: Side, n: int, count: int, *, stream: bool, pace: float = 0, whole: bool = False) -> list[float]:
    """`count` calls one after another (concurrency 1): the whole non-streaming answer, or the
    time to the first text event of a stream (to its end with `whole`). The first answer is
    checked."""
    samples = []
    for i in range(count):
        if stream:
            result = await stream_once(client, side, side.body(n, stream=True, pace=pace), keep=i == 0)
            if result.error or result.events != n:
                raise RuntimeError(f"{side.name}: {result.error or f'{result.events} text events, expected {n}'}")
            if i == 0 and (error := side.check(result.body, n, stream=True)):
                raise RuntimeError(f"{side.name}: bad stream: {error}")
            samples.append(result.total if whole else result.first)
        else:
            elapsed, data = await call_once(client, side, side.body(n, stream=False))
            if i == 0 and (error := side.check(data, n, stream=False)):
                raise RuntimeError(f"{side.name}: bad answer: {error}")
            samples.append(elapsed)
    return samples


@dataclass
class Load:
    """What one run of concurrent streams delivered, and what it cost the side's process."""

    streams: int = 0
    events: int = 0
    expected_events: int = 0
    failed: int = 0  # streams with an error or a missing event
    max_gap: float = 0.0  # the longest wait between two text events of a stream
    max_first: float = 0.0  # the longest wait for a first text event
    wall: float = 0.0
    cpu: float = 0.0  # CPU seconds of the side's process over the run
    core_busy: float = 0.0  # busy seconds of the core it is pinned to: itself and anything else
    rss_before_kb: int = 0
    rss_peak_kb: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: Load) -> None:
        for name in ("streams", "events", "expected_events", "failed", "wall", "cpu", "core_busy"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_gap = max(self.max_gap, other.max_gap)
        self.max_first = max(self.max_first, other.max_first)
        self.errors += other.errors[: 5 - len(self.errors)]


async def drive(
    side: Side,
    *,
    n: int,
    concurrency: int,
    k: int = 1,
    pace: float = 0,
    duration: float | None = None,
    spread: float = 0.0,
) -> Load:
    """`concurrency` workers, each starting `spread / concurrency` seconds after the previous
    one, each running one stream (or, with `duration`, stream after stream until it is up).
    Worker 0's first stream is checked in full. A fresh client, with its connections opened
    before the clock starts; they close at the end, so the side holds none afterwards."""
    body = side.body(n, stream=True, k=k, pace=pace)
    load = Load()
    proc = side.proc
    peak = [proc.rss_kb() if proc else 0]
    load.rss_before_kb = peak[0]

    async def sample_rss() -> None:
        while True:
            await asyncio.sleep(0.1)
            peak[0] = max(peak[0], proc.rss_kb())

    async def worker(i: int, client: Client, deadline: float | None) -> None:
        await asyncio.sleep(spread * i / concurrency)
        first = True
        while True:
            result = await stream_once(client, side, body, keep=first and i == 0)
            load.streams += 1
            load.events += result.events
            load.expected_events += n
            load.max_gap = max(load.max_gap, result.max_gap)
            load.max_first = max(load.max_first, result.first or 0.0)
            error = result.error or (None if result.events == n else f"{result.events} text events, expected {n}")
            if error is None and result.body is not None:
                error = side.check(result.body, n, stream=True)
            if error:
                load.failed += 1
                if len(load.errors) < 5:
                    load.errors.append(error)
            first = False
            if deadline is None or time.perf_counter() >= deadline:
                return

    client = side.client()
    await client.connect(concurrency)  # not measured: a connection's setup is no stall
    try:
        sampler = asyncio.create_task(sample_rss()) if proc else None
        cpu = proc.cpu_seconds() if proc else 0.0
        busy = core_busy_seconds(side.cpu) if side.cpu is not None else 0.0
        started = time.perf_counter()
        deadline = started + duration if duration else None
        await asyncio.gather(*(worker(i, client, deadline) for i in range(concurrency)))
        load.wall = time.perf_counter() - started
        load.cpu = proc.cpu_seconds() - cpu if proc else 0.0
        load.core_busy = core_busy_seconds(side.cpu) - busy if side.cpu is not None else 0.0
        if sampler:
            sampler.cancel()
            peak[0] = max(peak[0], proc.rss_kb())
    finally:
        client.close()
    load.rss_peak_kb = peak[0]
    return load
