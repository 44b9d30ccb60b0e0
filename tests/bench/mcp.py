"""`python -m tests.bench.mcp [--rounds 20] [--calls 15] [--markdown]`: the proxy's own time per
MCP tool round (design.md 14.4).

One process, one event loop (uvloop where installed, as `responses-proxy` runs): the proxy
(`Running`, as the tests start it, its store a SQLite file of its own), the fake upstream of the
tests (`FakeUpstream`, no delay), the SDK's MCP server (`ToolServer`) and the client. Calls run
one at a time, so a call's wall time is the work of everything it touches, and the difference
between two ways of doing the same work is what one of them adds. `--rounds` rounds of `--calls`
calls of each, one of each after another, their order turning each time:

(a) a whole (non-streaming) Response whose model calls the MCP tool `echo`
    (`require_approval: "never"`) and then answers: the second turn of a chain whose first turn
    listed the tools, so that only the call and the two model rounds happen (`store: false`: it
    reads its chain, one stored turn, and writes nothing);
(b) the same work without the proxy: the two chat calls the proxy made for (a), their bodies as
    it sent them, straight to the fake upstream (aiohttp), and one `tools/call` of `echo` through
    the SDK's `mcp.Client` on a fresh connection (`cache=None`), as the proxy makes it;
(c) a Response with no tools (one model round) through the proxy, and its one chat call direct.

(a) - (b) is what the proxy adds to a Response with one tool round; (c)'s difference, what it
adds to one without MCP, for reference. Every request asks for logprobs (top 2). Most of (b) is
the MCP connection, the same on both sides: its HTTP client builds a TLS context (the CA bundle
loaded, even for http://) each time. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.client import LOGPROBS
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import Running, config
from tests.mcp_servers import ToolServer

from .report import print_grid

TLS = httpx2.create_ssl_context()
ECHO = types.CallToolRequest(params=types.CallToolRequestParams(name="echo", arguments={"text": "hello"}))

ARGUMENTS = '{"text": "hello"}'
CALL = Generation(
    [
        Step("tool", ARGUMENTS, [score(ARGUMENTS)], tool_id="call_1", tool_name="calc__echo"),
        Step("finish", finish_reason="tool_calls", scores=[score("<call>")]),
    ]
)
ANSWER = Generation(
    [
        *(Step("text", word, [score(word)]) for word in ("It ", "said ", "hello.")),
        Step("finish", finish_reason="stop", scores=[score("<eos>")]),
    ]
)
COLUMNS = (
    "measure",
    "proxy p50",
    "proxy p90",
    "direct p50",
    "direct p90",
    "added p50",
    "added p90",
    "ratio p50",
    "note",
)


def reply(body: dict[str, Any]) -> Reply:
    """The model calls the tool when asked to echo, and answers anything else (its result too)."""
    last = body["messages"][-1]
    return Reply(CALL if last["role"] == "user" and "echo" in str(last["content"]) else ANSWER)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {answer}")
        return answer


async def start_tools() -> ToolServer:
    tools = ToolServer()
    await tools.start()
    return tools


async def bench(rounds: int, calls: int) -> tuple[dict[str, list[float]], list[dict[str, float]], list[float]]:
    """Every call's seconds by side, each round's medians by side, and (b)'s `tools/call`s alone."""
    upstream, tools = FakeUpstream(), await start_tools()
    upstream.choose = reply
    await upstream.start()
    running = await Running.start(config(upstream.url, mcp={"allowed_servers": [tools.url]}))
    try:
        async with aiohttp.ClientSession() as http:
            responses, chat = f"{running.url}/v1/responses", f"{upstream.url}/v1/chat/completions"
            mcp = {"type": "mcp", "server_label": "calc", "server_url": tools.url, "require_approval": "never"}
            common = {"model": "m", "include": LOGPROBS, "top_logprobs": 2, "store": False}
            first = await post(http, responses, {**common, "store": True, "input": "hi", "tools": [mcp]})
            assert [item["type"] for item in first["output"]] == ["mcp_list_tools", "message"], first["output"]
            turn = {**common, "previous_response_id": first["id"], "input": "echo hello", "tools": [mcp]}
            plain = {**common, "input": "hi"}

            upstream.requests.clear()
            answer = await post(http, responses, turn)
            assert [item["type"] for item in answer["output"]] == ["mcp_call", "message"], answer["output"]
            # Listed by the first turn alone: the call is sent by the session (14.4), as (b)'s is.
            assert answer["output"][0]["output"] == "hello" and tools.list_requests == 1
            await post(http, responses, plain)
            call_body, answer_body, plain_body = upstream.requests  # what the proxy sent, to send direct
            mcp_calls: list[float] = []

            async def direct_tool_round() -> None:
                await post(http, chat, call_body)
                started = time.perf_counter()
                # As the proxy connects: a TLS context made once, not one per connection.
                to_tools = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(verify=TLS))
                transport = streamable_http_client(tools.url, http_client=to_tools)
                async with to_tools, Client(transport, cache=None) as client:
                    result = await client.session.send_request(ECHO, types.CallToolResult)
                mcp_calls.append(time.perf_counter() - started)
                assert not result.is_error
                await post(http, chat, answer_body)

            sides: dict[str, Callable[[], Awaitable[Any]]] = {
                "a": lambda: post(http, responses, turn),
                "b": direct_tool_round,
                "c proxy": lambda: post(http, responses, plain),
                "c direct": lambda: post(http, chat, plain_body),
            }
            for call in sides.values():  # warm-up: imports, pools, caches
                for _ in range(calls):
                    await call()
            mcp_calls.clear()
            samples: dict[str, list[float]] = {name: [] for name in sides}
            per_round: list[dict[str, float]] = []
            order = list(sides)
            for r in range(rounds):
                taken: dict[str, list[float]] = {name: [] for name in order}
                # Call by call, the order turning each time: the host's drift (this VM's core
                # speed, its other work) hits every side alike, even within a round.
                for i in range(calls):
                    shift = (r + i) % len(order)
                    for name in order[shift:] + order[:shift]:
                        started = time.perf_counter()
                        await sides[name]()
                        taken[name].append(time.perf_counter() - started)
                medians = {name: statistics.median(values) for name, values in taken.items()}
                for name, values in taken.items():
                    samples[name] += values
                per_round.append(medians)
                upstream.requests.clear()  # the fakes keep what they were sent
                tools.calls.clear()
                tools.headers.clear()
                say(f"round {r + 1}/{rounds}: " + ", ".join(f"{name} {medians[name] * 1e3:.2f} ms" for name in order))
            return samples, per_round, mcp_calls
    finally:
        await running.runner.cleanup()
        await tools.close()
        await upstream.close()


def row(measure: str, proxy: list[float], direct: list[float], ratios: list[float], note: str) -> list[str]:
    def ms(seconds: float, sign: str = "") -> str:
        return f"{seconds * 1000:{sign}.2f} ms"

    p50, p90 = (pct(proxy, q) for q in (0.5, 0.9))
    d50, d90 = (pct(direct, q) for q in (0.5, 0.9))
    # A call and the other side's next to it ran within a few milliseconds of each other: their
    # differences' median is the least moved by the host's drift.
    paired = statistics.median(p - d for p, d in zip(proxy, direct, strict=True))
    spread = f"median of paired differences {ms(paired, '+')}; rounds' ratios {min(ratios):.2f}-{max(ratios):.2f}"
    return [
        measure,
        ms(p50),
        ms(p90),
        ms(d50),
        ms(d90),
        ms(p50 - d50, "+"),
        ms(p90 - d90, "+"),
        f"{p50 / d50:.2f}x",
        f"{note}; {spread}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.mcp", description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=15, help="calls of each kind per round (default: %(default)s)")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown, for the README")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    started = time.monotonic()
    samples, per_round, mcp_calls = (uvloop.run if uvloop else asyncio.run)(bench(args.rounds, args.calls))
    n = args.rounds * args.calls
    cells = [
        row(
            "Response with one MCP tool round (a vs b)",
            samples["a"],
            samples["b"],
            [m["a"] / m["b"] for m in per_round],
            f"{n} each; direct: 2 chat calls and a tools/call on a fresh connection ({statistics.median(mcp_calls) * 1e3:.2f} ms of it)",
        ),
        row(
            "Response with no tools, one model round (c)",
            samples["c proxy"],
            samples["c direct"],
            [m["c proxy"] / m["c direct"] for m in per_round],
            f"{n} each; direct: 1 chat call",
        ),
    ]
    command = shlex.join(["python", "-m", "tests.bench.mcp", *(argv if argv is not None else sys.argv[1:])])
    loop = "uvloop" if uvloop else "asyncio"
    header = f"{command}  ({time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - started:.0f} s; one process, {loop}, calls one at a time)"
    print_grid(header, COLUMNS, cells, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
