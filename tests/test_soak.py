"""Load and soak: hundreds of concurrent streams through the proxy while the fake
upstream injects a mix of faults. No 500 from the proxy itself, every stream ends with
exactly one terminal event, every stream that no fault touched carries exactly the scripted
text and scores, and at the end RSS is back near its baseline with no upstream connection
or task left.

Bounded in time: `SOAK_SECONDS` (default 10) of load at `SOAK_STREAMS` (default 250)
concurrent clients; e.g. `SOAK_SECONDS=600 pytest tests/test_soak.py` for a long soak.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from tests.client import LOGPROBS, parse_sse, read_events
from tests.events import TERMINAL, as_response_logprob, check_stream, framed
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score, sglang_error, vllm_error
from tests.harness import handler_errors, rss, settled

SECONDS = float(os.environ.get("SOAK_SECONDS", "10"))
STREAMS = int(os.environ.get("SOAK_STREAMS", "250"))
TIMEOUT = 3.0  # first byte and idle: what the stalling faults wait for
BODY = {"model": "m", "include": LOGPROBS, "top_logprobs": 2}


def generations() -> list[Generation]:
    words = [Step("text", f"w{i} ", [score(f"w{i}", -0.01 * i)]) for i in range(24)]
    think = [Step("reasoning", f"r{i} ", [score(f"r{i}")]) for i in range(8)]
    tool = [
        Step("tool", '{"city":', [score("{")], tool_id="call_1", tool_name="weather"),
        Step("scores", scores=[score("c")]),
        Step("tool", ' "Oslo"}', [score("O")]),
    ]
    gens = []
    for dialect in ("sglang", "vllm"):
        gens += [
            Generation([*words, Step("finish", finish_reason="stop", scores=[score("<eos>")])], dialect=dialect),
            Generation([*think, *words[:10], Step("finish", finish_reason="stop")], reasoning_tokens=8, dialect=dialect),
            Generation([*think[:3], *words[:5], *tool, Step("finish", finish_reason="tool_calls")], dialect=dialect),
            Generation([*words[:12], Step("finish", finish_reason="length")], dialect=dialect),
        ]
    return gens


GENS = generations()


def expected(gen: Generation) -> tuple[str, str, list[dict], list[tuple[str, str]]]:
    """(terminal, text, scores, [(call name, arguments)]) of a generation, from its script alone."""
    finish = next(s.finish_reason for s in gen.steps if s.kind == "finish")
    terminal = "response.incomplete" if finish == "length" else "response.completed"
    text = "".join(s.text for s in gen.steps if s.kind == "text")
    calls: dict[int, tuple[str, str]] = {}
    for s in gen.steps:
        if s.kind == "tool":
            name, arguments = calls.get(s.tool_index, (s.tool_name, ""))
            calls[s.tool_index] = (name, arguments + s.text)
    return terminal, text, [as_response_logprob(entry) for s in gen.steps for entry in s.scores], list(calls.values())


HALF_JSON = b'data: {"choices": [{"delta": {"content": \n\n'


def with_noise(gen: Generation) -> list[bytes]:
    """The generation's frames with `choices: []` chunks and comments between them."""
    return [f for frame in framed(gen.chunks()) for f in (frame, b'data: {"choices": []}\n\n: ping\n\n')] + [b"data: [DONE]\n\n"]


@dataclass(frozen=True)
class Case:
    name: str
    weight: int
    reply: Callable[[Generation], Reply]
    outcome: str  # exact | failed | completed-or-failed | <HTTP status>
    stream: bool = True
    hang_up: bool = False


CASES = [
    Case("exact", 30, lambda g: Reply(g), "exact"),
    Case("exact-split", 10, lambda g: Reply(g, write_size=251, line_ending="\r\n"), "exact"),
    Case("exact-coalesced", 5, lambda g: Reply(g, coalesce=True), "exact"),
    Case("exact-paced", 5, lambda g: Reply(g, delay=0.005), "exact"),
    Case("exact-noise", 5, lambda g: Reply(frames=with_noise(g)), "exact"),
    Case("exact-no-done", 5, lambda g: Reply(g, done=False), "exact"),
    Case("exact-plain", 10, lambda g: Reply(g), "exact", stream=False),
    Case("error-frame", 6, lambda g: Reply(g, error_frame_after=4), "failed"),
    Case("dropped", 6, lambda g: Reply(g, drop_after=5), "failed"),
    Case("dropped-after-finish", 3, lambda g: Reply(g, drop_after=len(g.chunks()) - 1), "exact"),
    Case("garbage", 4, lambda g: Reply(frames=[*framed(g.chunks())[:3], HALF_JSON, *framed(g.chunks())[3:], b"data: [DONE]\n\n"]), "failed"),
    Case("garbage-after-finish", 2, lambda g: Reply(g, extra_frames=[HALF_JSON]), "exact"),  # usage lost (design.md 4.9)
    Case("stalled", 2, lambda g: Reply(g, stall_after=3), "failed"),
    Case("slow-headers", 1, lambda g: Reply(g, headers_delay=TIMEOUT + 5), "504"),
    Case("reset", 4, lambda g: Reply(reset=True), "502"),
    Case("sglang-400", 3, lambda g: sglang_error(400, "context too long", "messages"), "400"),
    Case("vllm-500", 3, lambda g: vllm_error(500, "engine dead"), "502"),
    Case("plain-dropped", 3, lambda g: Reply(g, body_drop_after=20), "502", stream=False),
    Case("hang-up", 5, lambda g: Reply(g, delay=0.01), "hang-up", hang_up=True),
]


def settled_rss() -> int:
    """RSS once garbage is collected and freed heap pages are given back (glibc), so that
    what remains is what is still held, not allocator slack."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss()


class Soak:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.outcomes: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.hang_ups = 0
        self.checked = 0
        self.slowest = (0.0, "")

    def pick(self) -> tuple[int, int]:
        case = self.random.choices(range(len(CASES)), weights=[c.weight for c in CASES])[0]
        return case, self.random.randrange(len(GENS))

    @staticmethod
    def choose(chat: dict) -> Reply:
        case, gen, _ = map(int, chat["messages"][-1]["content"].split(":"))
        return CASES[case].reply(GENS[gen])

    async def one(self, http: aiohttp.ClientSession, url: str, n: int) -> None:
        index, g = self.pick()
        started = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(TIMEOUT + 40):
                await self._one(http, url, n, index, g)
        except TimeoutError:
            raise AssertionError(f"{CASES[index].name} on generation {g} took over {TIMEOUT + 40} s") from None
        self.slowest = max(self.slowest, (asyncio.get_running_loop().time() - started, CASES[index].name))

    async def _one(self, http: aiohttp.ClientSession, url: str, n: int, index: int, g: int) -> None:
        case, gen = CASES[index], GENS[g]
        body = {**BODY, "input": f"{index}:{g}:{n}", "stream": case.stream}
        async with http.post(f"{url}/v1/responses", json=body) as response:
            self.statuses[response.status] += 1
            assert response.status != 500, await response.text()
            if case.hang_up:
                assert response.status == 200
                async for event in read_events(response):
                    if event["type"].endswith("_text.delta"):
                        break
                response.close()
                self.hang_ups += 1
                return
            raw = await response.read()
        if case.outcome.isdigit():
            assert response.status == int(case.outcome), (case.name, raw[:300])
            error = orjson.loads(raw)["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"], error
            self.outcomes[case.name] += 1
            return
        assert response.status == 200, (case.name, raw[:300])
        terminal, text, scores, calls = expected(gen)
        if not case.stream:
            final = orjson.loads(raw)
            assert final["status"] == terminal.removeprefix("response."), case.name
            self.exact(case, final, text, scores, calls)
            return
        events_ = parse_sse(raw)
        types = [e["type"] for e in events_]
        assert [e["sequence_number"] for e in events_] == list(range(len(events_))), case.name
        assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL, (case.name, types)
        if n % 25 == 0:  # the whole contract, both schemas, on a sample (it costs)
            check_stream(events_)
            self.checked += 1
        if case.outcome == "failed":
            assert types[-2:] == ["error", "response.failed"], (case.name, types[-3:])
            self.outcomes[case.name] += 1
        else:
            assert types[-1] == terminal, (case.name, types[-3:])
            self.exact(case, events_[-1]["response"], text, scores, calls)

    def exact(self, case: Case, response: dict, text: str, scores: list[dict], calls: list[tuple[str, str]]) -> None:
        messages = [item for item in response["output"] if item["type"] == "message"]
        assert [m["content"][0]["text"] for m in messages] == [text], case.name
        assert messages[0]["content"][0]["logprobs"] == scores, case.name
        made = [(item["name"], item["arguments"]) for item in response["output"] if item["type"] == "function_call"]
        assert made == calls, case.name
        self.outcomes[case.name] += 1


async def test_soak(upstream: FakeUpstream, launch, baseline, caplog) -> None:
    running = await launch(timeouts={"first_byte": TIMEOUT, "idle": TIMEOUT})
    caplog.set_level(logging.WARNING)
    soak = Soak(seed=5)
    upstream.choose = soak.choose
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT + 45)) as http:
        # Warm up (pools, imports, allocator), then the baseline.
        await asyncio.gather(*(soak.one(http, running.url, n) for n in range(STREAMS)))
        await settled(running, upstream, baseline, within=TIMEOUT + 10)
        before = settled_rss()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + SECONDS
        counter = iter(range(STREAMS, 10**9))

        async def client() -> None:
            while loop.time() < deadline:
                await soak.one(http, running.url, next(counter))
                if len(upstream.requests) > 100:  # what the fake records must not count as growth
                    upstream.requests.clear()
                    upstream.headers.clear()

        await asyncio.gather(*(client() for _ in range(STREAMS)))
    done = sum(soak.outcomes.values()) + soak.hang_ups
    await settled(running, upstream, baseline, within=TIMEOUT + 10)
    assert upstream.disconnects >= soak.hang_ups
    upstream.choose = None
    grown = settled_rss() - before
    errors = handler_errors(caplog.records)
    print(f"\nsoak: {done} requests in {SECONDS:.0f} s at {STREAMS} concurrent, {soak.checked} fully checked, "
          f"RSS {grown / 2**20:+.1f} MiB, statuses {dict(soak.statuses)}, slowest {soak.slowest}, "
          f"handler errors {len(errors)}")
    assert 500 not in soak.statuses
    assert not errors, f"{len(errors)} handler errors, first: {errors[0].getMessage()} {errors[0].exc_info and errors[0].exc_info[1]!r}"
    assert all(soak.outcomes[c.name] for c in CASES if not c.hang_up and c.weight >= 3), soak.outcomes
    assert done >= STREAMS
    assert grown < 30 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over the soak"
