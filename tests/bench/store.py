"""`python -m tests.bench.store [--sessions 8] [--rounds 5] [--seconds 3] [--markdown]`: what the Redis
store costs a turn, on one server and on a 3-primary cluster (design.md 9.9).

For each form, a fresh store (real `redis-server` processes: one, or six made into a cluster by
`redis-cli --cluster create`) and a fresh proxy over it in front of the fast fake upstream. First
one Codex-like session of 10 turns (Codex 0.171's own first request, recorded, its tools and
instructions; 60 tokens an answer; then a user message a turn), kept, once chained by
`previous_response_id` and once sending its whole history each turn as Codex does: the bytes the
store holds a turn (the sum of `MEMORY USAGE` of every key, over every node), the commands a
turn (Redis's own count, `INFO commandstats`: those a script runs included), and the median
latency of a turn against the same sessions with `store: false` (the store's share of it), 15 of
each, alternating. Then
`--sessions` chained sessions at once, each a loop of 10-turn sessions, for `--seconds`, in
`--rounds` rounds that alternate between the two (both proxies and stores up throughout, the
stores' processes on the load's CPU): turns per second and the proxy's CPU a turn, medians of
the rounds. The last line: the cluster's cost a turn against one server's, the median of the
rounds' ratios of turns/s. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

from tests.redis_server import Cluster, RedisServer, cluster_binary, command_calls

from . import procs
from .report import print_grid
from .upstream import model_name

CODEX = orjson.loads((procs.REPOSITORY.parent / "shared/fixtures/clients/codex-0.171-turn1.json").read_bytes())
TURNS = 10
SESSIONS = 15  # of each kind, kept and not, for the latency a turn
COLUMNS = ("store", "session", "kept a turn", "commands a turn", "latency a turn", "the store's share", "turns/s", "proxy CPU a turn")


def nodes(url: str) -> list[redis.Redis]:
    """A client of each primary the URL's store has."""
    if not url.startswith("redis+cluster://"):
        return [redis.Redis.from_url(url)]
    host, _, port = url.removeprefix("redis+cluster://").split(",")[0].partition(":")
    with redis.Redis(host=host, port=int(port)) as seed:
        ranges = seed.execute_command("CLUSTER", "SLOTS")
    return [redis.Redis(host=primary[0].decode(), port=int(primary[1])) for _s, _e, primary, *_ in ranges]


def kept_bytes(url: str) -> int:
    return sum(node.memory_usage(key) or 0 for node in nodes(url) for key in node.scan_iter(count=1000))


def flush(url: str) -> None:
    for node in nodes(url):
        node.flushall()


class Session:
    """Codex's first request, then a user message a turn: chained, or its history sent whole."""

    def __init__(self, chained: bool, store: bool = True) -> None:
        self.chained, self.store = chained, store
        self.previous: str | None = None
        self.history: list[Any] = []

    def body(self, turn: int) -> dict[str, Any]:
        said = list(CODEX["input"]) if turn == 0 else [{"type": "message", "role": "user", "content": f"and now step {turn}"}]
        body = {**CODEX, "model": model_name(60), "stream": False, "store": self.store, "include": []}
        if self.chained and self.previous:
            return {**body, "input": said, "previous_response_id": self.previous}
        self.history += said
        return {**body, "input": self.history}

    def answered(self, answer: dict[str, Any]) -> None:
        self.previous = answer["id"]
        self.history += [item for item in answer["output"] if item["type"] != "reasoning"]


async def session(http: aiohttp.ClientSession, url: str, kind: Session) -> list[float]:
    """One session of `TURNS` turns; each turn's latency."""
    latencies = []
    for turn in range(TURNS):
        started = time.perf_counter()
        async with http.post(f"{url}/v1/responses", json=kind.body(turn)) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"turn {turn}: {response.status} {answer}")
        latencies.append(time.perf_counter() - started)
        kind.answered(answer)
    return latencies


async def footprint(url: str, store_url: str) -> dict[str, dict[str, float]]:
    """Per kind of session: bytes kept, commands and latency a turn, and against `store: false`."""
    measured = {}
    async with aiohttp.ClientSession() as http:
        for name, chained in (("chained", True), ("whole history", False)):
            flush(store_url)
            before = command_calls(store_url)
            await session(http, url, Session(chained))
            commands = sum((command_calls(store_url) - before).values()) - len(nodes(store_url))  # INFO's own
            kept: list[float] = []
            unkept: list[float] = []
            for _ in range(SESSIONS):  # alternating, so that drift hits both alike
                kept += await session(http, url, Session(chained))
                unkept += await session(http, url, Session(chained=False, store=False))
            measured[name] = {
                "bytes": kept_bytes(store_url) / ((1 + SESSIONS) * TURNS),
                "commands": commands / TURNS,
                "latency": statistics.median(kept),
                "share": 1 - statistics.median(unkept) / statistics.median(kept),
            }
    return measured


async def throughput(url: str, proxy: procs.Proc, sessions: int, seconds: float) -> dict[str, float]:
    """`sessions` chained sessions at once, each a loop of sessions, for `seconds`."""
    turns = 0
    deadline = time.monotonic() + seconds

    async def loop(http: aiohttp.ClientSession) -> None:
        nonlocal turns
        while time.monotonic() < deadline:
            made = len(await session(http, url, Session(chained=True)))
            turns += made  # after the await: `turns += len(await ...)` reads `turns` before it

    cpu, started = proxy.cpu_seconds(), time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(loop(http) for _ in range(sessions)))
    return {"turns/s": turns / (time.monotonic() - started), "cpu": (proxy.cpu_seconds() - cpu) / turns}


@contextmanager
def a_store(form: str, directory: Path, cpu: int) -> Iterator[str]:
    """The URL of a fresh store of this form, its processes on `cpu`, stopped after."""
    directory.mkdir(parents=True)
    with Cluster(directory) if form == "cluster" else RedisServer(directory) as servers:
        for server in servers.nodes if isinstance(servers, Cluster) else [servers]:
            server.pin(cpu)
        yield servers.url


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.store", description=__doc__.splitlines()[1])
    parser.add_argument("--sessions", type=int, default=8, help="chained sessions at once, for turns/s")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of turns/s on each store, alternating")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long a round lasts")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown, for the README")
    parser.add_argument("--logs", default="bench-results/logs")
    args = parser.parse_args(argv)
    if cluster_binary() is None:
        raise SystemExit("no redis-server 7 or later with redis-cli, to run a cluster")
    logs = Path(args.logs)
    pinning = procs.Pinning()
    say(pinning.describe())
    started = time.monotonic()
    forms = ("one server", "cluster")
    with tempfile.TemporaryDirectory(prefix="bench-store-") as scratch, ExitStack() as running:
        upstream = procs.start_upstream(pinning, logs)
        running.callback(upstream.stop)
        stores, proxies = {}, {}
        for form in forms:
            stores[form] = running.enter_context(a_store(form, Path(scratch) / form, pinning.load_cpu))
            proxies[form] = procs.start_proxy(f"store-{form.replace(' ', '-')}", pinning, logs, stores[form], upstream.url)
            running.callback(proxies[form].stop)
            proxies[form].wait_healthy()
        kinds = {}
        for form in forms:
            say(f"{form}: a session chained and one whole, kept and not")
            kinds[form] = asyncio.run(footprint(proxies[form].url, stores[form]))
            flush(stores[form])
        rounds: dict[str, list[dict[str, float]]] = {form: [] for form in forms}
        for number in range(args.rounds):
            say(f"round {number + 1} of {args.rounds}: {args.sessions} chained sessions at once, {args.seconds:g} s on each")
            for form in forms if number % 2 == 0 else forms[::-1]:
                rounds[form].append(asyncio.run(throughput(proxies[form].url, proxies[form], args.sessions, args.seconds)))
    rate = {form: {key: statistics.median(r[key] for r in rounds[form]) for key in ("turns/s", "cpu")} for form in forms}
    cells = [
        [
            form, name, f"{m['bytes'] / 1000:.1f} kB", f"{m['commands']:.1f}", f"{m['latency'] * 1000:.2f} ms", f"{m['share']:.0%}",
            f"{rate[form]['turns/s']:.0f}" if name == "chained" else "-", f"{rate[form]['cpu'] * 1000:.2f} ms" if name == "chained" else "-",
        ]
        for form in forms
        for name, m in kinds[form].items()
    ]
    command = "python -m tests.bench.store " + " ".join(argv if argv is not None else sys.argv[1:])
    header = f"{command.strip()}  ({time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - started:.0f} s)"
    print_grid(header, COLUMNS, cells, args.markdown)
    ratios = [one["turns/s"] / other["turns/s"] for one, other in zip(rounds["one server"], rounds["cluster"], strict=True)]
    print(
        f"\nA turn on the cluster costs {statistics.median(ratios):.2f}x one on one server (the median of {args.rounds}"
        f" rounds' turns/s of {args.sessions} chained sessions at once: {', '.join(f'{r:.2f}' for r in ratios)})."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
