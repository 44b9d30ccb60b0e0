"""`python -m tests.bench.memory [--streams 200] [--rss]`: where an open stream's memory goes.

The proxy runs under tracemalloc; N streams of 40 chunks at 10 chunks/s (the RSS row of
`make bench`) are opened, and the proxy's Python allocations at their 36th chunk are compared
with those before them, per allocation site, per stream. The sites are one frame deep: the line
that allocated, in the proxy or in a library.

With `--rss`, no tracing: the RSS growth per open stream of the proxy and of the pass-through
under that load (`--streams 400` is the bench's), each on fresh processes that served a few
streams first (cold, as the bench's row: the load's connections and the allocator's first
arenas count too), and on fresh processes that served an unpaced load as large just before
(warm: the growth beyond what that load left in place, which the open streams hold).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import aiohttp

from . import procs
from .load import Side, drive

CHUNKS, PACE = 40, 10


def serve(snapshots: Path, proxy_args: list[str]) -> int:
    """The proxy, traced; each SIGUSR1 writes a snapshot to the next numbered file."""
    from proxy.cli import main

    tracemalloc.start(1)
    taken = 0

    def dump(*_: object) -> None:
        nonlocal taken
        tracemalloc.take_snapshot().dump(str(snapshots / f"{taken}.snapshot"))
        taken += 1

    signal.signal(signal.SIGUSR1, dump)
    return main(proxy_args)


async def open_streams(url: str, proxy: procs.Proc, streams: int) -> None:
    body = {"input": "hi", "top_logprobs": 5, "include": ["message.output_text.logprobs"], "store": False, "stream": True}

    async def one(session: aiohttp.ClientSession, model: str) -> None:
        async with session.post(f"{url}/v1/responses", json={**body, "model": model}) as response:
            async for _ in response.content.iter_any():
                pass

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # Unpaced first, so that pools, caches and the allocator's arenas are as a warm proxy's.
        await asyncio.gather(*(one(session, f"bench:n={CHUNKS},k=1") for _ in range(streams)))
        await asyncio.sleep(0.5)
        proxy.popen.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1)
        paced = [asyncio.create_task(one(session, f"bench:n={CHUNKS},k=1,pace={PACE}")) for _ in range(streams)]
        await asyncio.sleep((CHUNKS - 4) / PACE)
        proxy.popen.send_signal(signal.SIGUSR1)
        await asyncio.sleep(1)
        await asyncio.gather(*paced)


def report(snapshots: Path, streams: int, top: int) -> None:
    before = tracemalloc.Snapshot.load(str(snapshots / "0.snapshot"))
    during = tracemalloc.Snapshot.load(str(snapshots / "1.snapshot"))
    sites = during.compare_to(before, "lineno")
    total = sum(site.size_diff for site in sites)
    print(f"Python allocations per open stream at chunk {CHUNKS - 4} of {CHUNKS}: {total / streams / 1024:.1f} kB")
    packages = str(Path(aiohttp.__file__).parents[1]) + "/"
    root = str(Path(__file__).resolve().parents[2]) + "/"
    for site in sites[:top]:
        frame = site.traceback[0]
        where = frame.filename.replace(packages, "").replace(root, "")
        print(f"{site.size_diff / streams:8.0f} B {site.count_diff / streams:6.1f} blocks  {where}:{frame.lineno}")


async def rss_growth(side: Side, streams: int, warm: bool) -> float:
    """kB of RSS a stream, at the peak of `streams` open streams against before them."""
    for load in (dict(n=CHUNKS, concurrency=streams if warm else 4), dict(n=CHUNKS, concurrency=streams, pace=PACE, spread=1.0)):
        await asyncio.sleep(0.5)
        done = await drive(side, **load)
        if done.failed:
            raise RuntimeError(f"{side.name}: {done.failed} streams failed: {done.errors}")
    return (done.rss_peak_kb - done.rss_before_kb) / streams


def rss(streams: int, logs: Path) -> None:
    pinning = procs.Pinning()
    print(pinning.describe())
    for warm in (False, True):
        running = procs.start_all(pinning, logs)
        try:
            sides = [Side(name, running[name].port, name == "proxy", running[name], pinning.test_cpu) for name in ("baseline", "proxy")]
            grown = {side.name: asyncio.run(rss_growth(side, streams, warm)) for side in sides}
        finally:
            procs.stop_all(running)
        print(f"{'warm' if warm else 'cold'}: RSS per open stream, proxy {grown['proxy']:.1f} kB, baseline {grown['baseline']:.1f} kB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--top", type=int, default=20, help="how many allocation sites to list")
    parser.add_argument("--rss", action="store_true", help="RSS growth per stream, proxy and pass-through, cold and warm (no tracing)")
    parser.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)  # the traced proxy's side
    args, rest = parser.parse_known_args(argv)
    if args.serve:
        return serve(Path(args.serve), rest)
    procs.raise_nofile()
    if args.rss:
        with tempfile.TemporaryDirectory() as logs:  # not the bench's logs and store
            rss(args.streams, Path(logs))
        return 0
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        upstream_port, port = procs.free_port(), procs.free_port()
        upstream = procs.Proc("upstream", [sys.executable, "-m", "tests.bench.upstream", "--port", str(upstream_port)], upstream_port, [], folder)
        config = folder / "proxy.yaml"
        config.write_text(f"upstreams:\n  - name: bench\n    urls: [{upstream.url}]\nstore:\n  url: none\n")
        argv = [sys.executable, "-m", "tests.bench.memory", "--serve", work, "--config", str(config), "--port", str(port), "--log-level", "warning"]
        proxy = procs.Proc("proxy", argv, port, [], folder)
        try:
            upstream.wait_healthy()
            proxy.wait_healthy()
            started = time.monotonic()
            asyncio.run(open_streams(proxy.url, proxy, args.streams))
            report(folder, args.streams, args.top)
            print(f"({time.monotonic() - started:.1f} s)")
        finally:
            proxy.stop()
            upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
