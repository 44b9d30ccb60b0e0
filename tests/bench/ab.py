"""`python -m tests.bench.ab [--ref HEAD] [--k 1] [--rounds 10]`: the proxy at a git revision (A)
against this checkout's (B), in CPU per text event.

`make bench` runs the proxy and the pass-through one after the other, and this VM's core speed
drifts between rounds by more than a change of a few percent moves: the same code on both sides
(A/A: `--ref HEAD` on a clean tree) differs by up to a fifth in one round. Here each round runs
A and B back to back under the bench's paced load (measure 3: streams of text chunks with
top_logprobs 5, `store: false` unless `--request` says otherwise, the store SQLite or, with
`--store redis`, a redis-server of its own), the order turning each round; a change is judged by
the median of the rounds' B/A ratios, and their spread says how far to trust it. With
`--calls N`, a round is N calls one after another instead (measure 2's streams of 4 chunks at
500/s): the CPU a call and the p50 time to the first text event, for what a request costs.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from pathlib import Path

from . import procs
from .__main__ import SETTINGS
from .load import Side, drive, latencies

WARMUP_CHUNKS = 50
BENCH = SETTINGS["full"]
CALL_CHUNKS, CALL_PACE = BENCH["first_n"], BENCH["first_pace"]  # measure 2's streams


def export(ref: str, into: Path) -> Path:
    """The `proxy` package as it is at `ref`, unpacked under `into`."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "proxy"], cwd=procs.REPOSITORY, check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


async def rounds(sides: list[Side], args: argparse.Namespace) -> list[dict[str, dict[str, float]]]:
    """Per round and side: `cpu`, microseconds a text event (or a call), and with `--calls`,
    `p50`, milliseconds to the first text event."""
    load = dict(n=args.chunks, concurrency=args.streams, k=args.k, pace=args.pace, spread=1 / args.pace)
    clients = {side.name: side.client() for side in sides}

    async def measure(side: Side) -> dict[str, float]:
        assert side.proc is not None
        if args.calls:
            cpu = side.proc.cpu_seconds()
            samples = await latencies(clients[side.name], side, CALL_CHUNKS, args.calls, stream=True, pace=CALL_PACE)
            return {"cpu": (side.proc.cpu_seconds() - cpu) / args.calls * 1e6, "p50": statistics.median(samples) * 1e3}
        run = await drive(side, **load)
        if run.failed:
            raise SystemExit(f"{side.name}: {run.failed} streams failed: {run.errors}")
        return {"cpu": run.cpu / run.events * 1e6}

    try:
        for side in sides:
            await (latencies(clients[side.name], side, CALL_CHUNKS, 30, stream=True, pace=CALL_PACE) if args.calls else drive(side, **{**load, "n": WARMUP_CHUNKS}))
        results = []
        for r in range(args.rounds):
            measured = {side.name: await measure(side) for side in (sides if r % 2 == 0 else sides[::-1])}
            results.append(measured)
            a, b = measured["A"], measured["B"]
            latency = f", p50 B-A {b['p50'] - a['p50']:+.3f} ms" if args.calls else ""
            print(f"round {r + 1}: A {a['cpu']:.1f} us, B {b['cpu']:.1f} us, B/A {b['cpu'] / a['cpu']:.3f}{latency}", flush=True)
    finally:
        for client in clients.values():
            client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ab", description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="HEAD", help="the revision A runs (default: %(default)s)")
    parser.add_argument("--k", type=int, default=1, help="chunks per upstream write (measure 3 runs 1 and 8)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=BENCH["cpu_n"], help="text chunks a stream")
    parser.add_argument("--streams", type=int, default=BENCH["cpu_streams"])
    parser.add_argument("--pace", type=float, default=BENCH["cpu_pace"], help="chunks a second a stream")
    parser.add_argument("--request", type=json.loads, default={"store": False}, help='Responses request fields, as JSON (default: {"store": false})')
    parser.add_argument("--store", choices=("sqlite", "redis"), default="sqlite", help="where both keep responses (redis: a redis-server started for the run)")
    parser.add_argument("--calls", type=int, default=0, help="calls one after another a round, instead of the paced load")
    parser.add_argument("--logs", default="bench-results/logs")
    args = parser.parse_args(argv)
    log_dir = Path(args.logs)
    pinning = procs.Pinning()
    print(pinning.describe())
    running: dict[str, procs.Proc | procs.Redis] = {}
    proxies: dict[str, procs.Proc] = {}
    with tempfile.TemporaryDirectory() as scratch:
        # Both run from copies at paths alike, so that neither gets a layout of its own from
        # where it lies (an A/A run from the checkout itself came out a few percent apart).
        trees = {"A": export(args.ref, Path(scratch) / "A"), "B": Path(scratch) / "B"}
        shutil.copytree(procs.REPOSITORY / "proxy", trees["B"] / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            running["upstream"] = upstream = procs.start_upstream(pinning, log_dir)
            if args.store == "redis":
                running["redis"] = redis = procs.Redis(pinning.prefix(pinning.load_cpu), log_dir)
            for number, (name, root) in enumerate(trees.items(), 1):
                # One Redis for both, each proxy in a database of its own.
                store = f"sqlite:{Path(scratch) / name}.db" if args.store == "sqlite" else f"{redis.url.rsplit('/', 1)[0]}/{number}"
                running[name] = proxies[name] = procs.start_proxy(f"ab-{name}", pinning, log_dir, store, upstream.url, root=root)
            for proxy in proxies.values():
                proxy.wait_healthy()
            sides = [Side(name, proxy.port, True, proxy, pinning.test_cpu, options=args.request) for name, proxy in proxies.items()]
            results = asyncio.run(rounds(sides, args))
        finally:
            for proc in reversed(running.values()):
                proc.stop()
    ratios = sorted(r["B"]["cpu"] / r["A"]["cpu"] for r in results)
    load = f"{args.calls} calls of {CALL_CHUNKS} chunks at {CALL_PACE}/s" if args.calls else f"{args.streams} streams x {args.chunks} chunks at {args.pace:g}/s, k={args.k}"
    unit = "a call" if args.calls else "a text event"
    latency = f"; p50 to the first text event B-A {statistics.median(r['B']['p50'] - r['A']['p50'] for r in results):+.3f} ms" if args.calls else ""
    print(
        f"A = {args.ref}, B = this checkout; {load}, {json.dumps(args.request)}, {args.store}: "
        f"B/A median {statistics.median(ratios):.3f} (rounds {ratios[0]:.3f} to {ratios[-1]:.3f}); "
        f"A {statistics.median(r['A']['cpu'] for r in results):.1f} us, B {statistics.median(r['B']['cpu'] for r in results):.1f} us {unit} (medians){latency}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
