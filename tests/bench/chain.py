"""`python -m tests.bench.chain [--depths 10,100,1000,5000] [--turns 5] [--ref REV] [--markdown]`:
what a turn costs deep in a chain of `previous_response_id` (design.md 9.2, 9.4).

For each store (SQLite, and Redis where `redis-server` is installed) a fresh proxy in front of
the fast fake upstream, and one chain through it: non-streaming turns of one token in and one
out, each continuing the last. At each depth, the `--turns` turns that reach it go through the
proxy: a turn's latency and the proxy's CPU for it (their medians), the time of the read of its
chain alone (`ResponseStore.chain` from this process, the median of as many), the bytes of the
deepest one's stored record and of all the chain's records so far (SQLite's `length(record)`,
Redis's `STRLEN`). Between depths the chain is lengthened by copies of the last turn's record, each
under ids of its own and linked to the one before, written as the proxy writes a turn
(`ResponseStore.put`): every turn through the proxy translates its whole chain, so a chain of
5,000 built so would take about a quarter of an hour; this takes seconds.

With `--ref`, the proxy as it is at that git revision instead, every turn through it (its
records are not this checkout's to copy): the numbers before a change, at small depths.
Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import aiohttp
import msgspec
import redis

from proxy.config import Store
from proxy.metrics import Metrics
from proxy.runtime import open_store
from proxy.store import ResponseStore, StoredResponse, owner_of
from proxy.store.backend import referable_items
from tests.redis_server import redis_binary

from . import procs
from .ab import export
from .report import print_grid
from .upstream import model_name

COLUMNS = ("store", "turn", "latency", "proxy CPU", "its chain's read", "its record", "the chain's records")


class Records:
    """The bytes of a stored record, read from the store the proxy keeps it in."""

    def __init__(self, url: str) -> None:
        self._sqlite = sqlite3.connect(url.removeprefix("sqlite:")) if url.startswith("sqlite:") else None
        self._redis = None if self._sqlite else redis.Redis.from_url(url)

    def size(self, id: str) -> int:
        if self._sqlite is not None:
            return int(self._sqlite.execute("SELECT length(record) FROM responses WHERE id = ?", (id,)).fetchone()[0])
        assert self._redis is not None
        return int(self._redis.strlen(f"{Store().prefix}response:{id}"))

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._redis is not None:
            self._redis.close()


def like(id: str) -> str:
    """A fresh id of the same kind and length."""
    kind, _, tail = id.partition("_")
    return f"{kind}_{secrets.token_hex(len(tail))[: len(tail)]}"


async def copy(store: ResponseStore, template: StoredResponse, previous: str) -> str:
    """`template` (a chained turn the proxy kept) again after `previous`, its ids and its items'
    fresh, of the same lengths: a record of the template's bytes; its id."""
    assert template.previous is not None
    fresh = {id: like(id) for id in (template.id, *(item for item, _ in referable_items(template)))}
    fresh[template.previous] = previous

    def renamed(raw: msgspec.Raw) -> msgspec.Raw:
        data = bytes(raw)
        for old, new in fresh.items():
            data = data.replace(old.encode(), new.encode())
        return msgspec.Raw(data)

    id = fresh[template.id]
    await store.put(msgspec.structs.replace(template, id=id, previous=previous, response=renamed(template.response), input_items=renamed(template.input_items)))
    return id


async def chain(url: str, proxy: procs.Proc, store_url: str, depths: list[int], turns: int, copies: bool) -> dict[int, dict[str, float]]:
    """One chain to the deepest depth; at each, the turns that reach it measured."""
    records = Records(store_url)
    kept = open_store(Store(url=store_url), Metrics()) if copies else None
    measured: dict[int, dict[str, float]] = {}
    previous, length, stored = None, 0, 0  # the chain's last response, its depth, its records' bytes
    try:
        async with aiohttp.ClientSession() as http:
            for depth in depths:
                if kept is not None and previous is not None and length >= 2:
                    template = await kept.get(previous, owner_of(None))
                    assert template is not None
                    while length < depth - turns:
                        previous = await copy(kept, template, previous)
                        length, stored = length + 1, stored + records.size(previous)
                window: deque[tuple[float, float]] = deque(maxlen=turns)  # the last turns' latency and CPU
                while length < depth:
                    body = {"model": model_name(1), "input": f"turn {length + 1:06}", **({"previous_response_id": previous} if previous else {})}
                    cpu, started = proxy.cpu_seconds(), time.perf_counter()
                    async with http.post(f"{url}/v1/responses", json=body) as response:
                        answer = await response.json()
                        if response.status != 200:
                            raise RuntimeError(f"turn {length + 1}: {response.status} {answer}")
                    window.append((time.perf_counter() - started, proxy.cpu_seconds() - cpu))
                    previous = answer["id"]
                    length, stored = length + 1, stored + records.size(previous)
                record = records.size(previous)
                latency, cpu = (statistics.median(samples) for samples in zip(*window, strict=True))
                measured[depth] = {"latency": latency, "cpu": cpu, "record": record, "stored": stored}
                if kept is not None:
                    measured[depth]["read"] = statistics.median([await read(kept, previous) for _ in range(turns)])
                say(f"  turn {depth}: {latency * 1000:.1f} ms, record {record} B, the chain's records {size(stored)}")
    finally:
        records.close()
        if kept is not None:
            await kept.close()
    return measured


async def read(store: ResponseStore, id: str) -> float:
    """The seconds of the read of a chain a turn makes, from this process."""
    started = time.perf_counter()
    await store.chain(id, owner_of(None))
    return time.perf_counter() - started


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def size(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.chain", description=__doc__.splitlines()[1])
    parser.add_argument("--depths", default="10,100,1000,5000", help="comma-separated depths (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=5, help="turns through the proxy at each depth, the last of them at it")
    parser.add_argument("--ref", help="the proxy at this git revision instead of this checkout's, every turn through it")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown, for the README")
    parser.add_argument("--logs", default="bench-results/logs")
    args = parser.parse_args(argv)
    depths = sorted({int(depth) for depth in args.depths.split(",")})
    logs = Path(args.logs)
    pinning = procs.Pinning()
    say(pinning.describe())
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-chain-") as scratch:
        root = export(args.ref, Path(scratch) / "tree") if args.ref else procs.REPOSITORY
        upstream = procs.start_upstream(pinning, logs)
        running: dict[str, procs.Proc | procs.Redis] = {"upstream": upstream}
        try:
            stores = {"SQLite": f"sqlite:{Path(scratch) / 'responses.db'}"}
            if redis_binary():
                redis_server = running["redis"] = procs.Redis(pinning.prefix(pinning.load_cpu), logs)
                stores["Redis"] = redis_server.url
            for name, url in stores.items():
                proxy = running[name] = procs.start_proxy(f"chain-{name.lower()}", pinning, logs, url, upstream.url, root=root)
                proxy.wait_healthy()
                say(f"{name}: a chain of {depths[-1]:,} turns")
                results[name] = asyncio.run(chain(proxy.url, proxy, url, depths, args.turns, copies=not args.ref))
                proxy.stop()
        finally:
            procs.stop_all(running)
    cells = [
        [
            name, f"{depth:,}", f"{m['latency'] * 1000:.1f} ms", f"{m['cpu'] * 1000:.1f} ms",
            f"{m['read'] * 1000:.1f} ms" if "read" in m else "-", f"{m['record']:,} B", size(m["stored"]),
        ]
        for name, by_depth in results.items()
        for depth, m in by_depth.items()
    ]
    command = "python -m tests.bench.chain " + " ".join(argv if argv is not None else sys.argv[1:])
    header = f"{command.strip()}  ({time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - started:.0f} s; medians of {args.turns} turns at each depth)"
    print_grid(header, COLUMNS, cells, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
