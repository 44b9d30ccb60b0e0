"""`python -m tests.bench.calls [--calls 1500] [--rounds 3]`: what one call costs the proxy.

The proxy and the baseline each take calls one after another (concurrency 1): a stream of one
text chunk and a non-streaming call of 64 tokens, every one with top_logprobs 5 and
`store: false`. Per call: the CPU time of the side's process (from /proc) and the p50
latency; then the proxy's extra over the baseline, round by round, the order turning each
round. The per-request part of the bench's latency rows (1, 2), without the per-event part.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from . import procs
from .load import Side, latencies

KINDS = {"stream of 1 chunk": (True, 1), "non-streaming, 64 tokens": (False, 64)}
WARMUP = 30


async def per_call(side: Side, proc: procs.Proc, stream: bool, n: int, calls: int) -> tuple[float, float]:
    """CPU microseconds per call and p50 milliseconds."""
    client = side.client()
    try:
        await latencies(client, side, n, WARMUP, stream=stream, whole=True)
        cpu = proc.cpu_seconds()
        samples = await latencies(client, side, n, calls, stream=stream, whole=True)
        cpu = proc.cpu_seconds() - cpu
    finally:
        client.close()
    return cpu / calls * 1e6, statistics.median(samples) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.calls", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1500, help="calls per side, kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--logs", default="bench-results/logs")
    args = parser.parse_args(argv)
    pinning = procs.Pinning()
    print(pinning.describe())
    running = procs.start_all(pinning, Path(args.logs))
    names = ["proxy", "baseline"]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for round_ in range(args.rounds):
            for kind, (stream, n) in KINDS.items():
                for name in names[round_ % 2 :] + names[: round_ % 2]:
                    proc = running[name]
                    assert isinstance(proc, procs.Proc)
                    side = Side(name, proc.port, name == "proxy", proc)
                    results.setdefault((kind, name), []).append(asyncio.run(per_call(side, proc, stream, n, args.calls)))
    finally:
        procs.stop_all(running)
    for kind in KINDS:
        proxy, baseline = results[(kind, "proxy")], results[(kind, "baseline")]
        extra_cpu = [p[0] - b[0] for p, b in zip(proxy, baseline, strict=True)]
        extra_ms = [p[1] - b[1] for p, b in zip(proxy, baseline, strict=True)]
        print(
            f"{kind}: CPU a call {statistics.median(p[0] for p in proxy):.0f} us (baseline {statistics.median(b[0] for b in baseline):.0f}), "
            f"extra {statistics.median(extra_cpu):.0f} us (rounds: {', '.join(f'{x:.0f}' for x in extra_cpu)}); "
            f"p50 extra {statistics.median(extra_ms):+.3f} ms (rounds: {', '.join(f'{x:+.3f}' for x in extra_ms)})"
        )
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.1f} s)")
    raise SystemExit(code)
