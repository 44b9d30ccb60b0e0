"""`python -m tests.bench [--quick] [--out bench-results/latest.json] [--markdown]`

The proxy against a pass-through baseline (`passthrough.py`) and a direct connection to a fast
fake SGLang upstream (`upstream.py`), side by side in one run, in interleaved rounds (their
order turning each round) so that drift hits every side alike. Every request asks for
logprobs with top_logprobs 5. Measured:

1. added latency of a non-streaming call at concurrency 1 (p50, p99; side minus direct);
2. added time to the first text event at concurrency 1;
3. CPU time of the proxy's process per text event, one chunk per upstream read (paced
   streams) and coalesced reads (k chunks per upstream write), against the baseline's;
4. text events per second per core at saturation (events / CPU seconds of the process),
   with the load generator's own ceiling (direct) next to it;
5. the most concurrent streams paced at 50 chunks/s held with every event delivered and no
   wait longer than 10 pacing intervals;
6. RSS per open stream; RSS after all the load against before, and what a repeat of the
   load keeps on top (a leak);
7. what keeping a response costs: the calls of 1 (non-streaming, and streams timed to their
   end) with `store: true`, kept in SQLite and in Redis, against `store: false`;
8. what a background stream costs: CPU per text event (as 3, one chunk per read) and time to
   the first text event (as 2) with `background: true`, against the same stream kept in the
   foreground, in SQLite and in Redis;
9. what tracing costs: CPU per text event (as 3, one chunk per read) of a proxy with tracing on,
   every span exported over OTLP/HTTP to a sink, against the proxy with it off (as shipped).

Everything but 7 and 8 asks with `store: false`: the translation alone, against the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import orjson

from . import procs
from .load import TOP_LOGPROBS, Load, Side, drive, latencies
from .report import Row, as_json, markdown_table, ms, text_table
from .upstream import generation

SETTINGS = {
    "full": dict(
        lat_rounds=10, lat_per_round=50, lat_n=64, first_n=4, first_pace=500,
        rss_streams=400, rss_pace=10, rss_n=40,
        cpu_rounds=5, cpu_streams=32, cpu_pace=50, cpu_n=150, coalesce=8,
        sat_rounds=2, sat_seconds=3.0, sat_streams=32, sat_n=256,
        levels=[100, 250, 500, 1000, 1500, 2000], level_pace=50, level_seconds=3.0, level_spread=1.0,
        store_rounds=6, store_per_round=25,
    ),
    "quick": dict(
        lat_rounds=4, lat_per_round=25, lat_n=64, first_n=4, first_pace=500,
        rss_streams=200, rss_pace=10, rss_n=20,
        cpu_rounds=2, cpu_streams=32, cpu_pace=50, cpu_n=75, coalesce=8,
        sat_rounds=1, sat_seconds=1.5, sat_streams=32, sat_n=256,
        levels=[100, 250, 500, 1000], level_pace=50, level_seconds=1.5, level_spread=1.0,
        store_rounds=2, store_per_round=15,
    ),
}
# Issue 15's targets: ratios against (or additions over) the baseline measured in the same run.
TARGETS = dict(
    added_over_baseline_ms=0.25, cpu_ratio={"k1": 1.25, "k8": 1.6}, events_per_core=20_000, rss_per_stream_kb=30, retained_share=0.10
)
UPSTREAM_BOUND = 0.9  # a rate within 10% of the load generator's ceiling


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def turn(items: list, i: int) -> list:
    """The round's order: rotated by one each round."""
    i %= len(items)
    return items[i:] + items[:i]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def stats_reads(side: Side) -> int:
    reader, writer = await asyncio.open_connection(side.host, side.port)
    writer.write(b"GET /stats HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    return orjson.loads(data.split(b"\r\n\r\n", 1)[1])["reads"]


class Phases:
    """Seconds per phase, for the JSON; each phase announces itself on stderr."""

    def __init__(self, run: dict) -> None:
        self.times = run["phase_seconds"] = {}
        self.name, self.started = None, time.monotonic()

    def __call__(self, name: str, text: str) -> None:
        self.close()
        say(f"{name}. {text}")
        self.name, self.started = name, time.monotonic()

    def close(self) -> None:
        if self.name:
            self.times[self.name] = round(time.monotonic() - self.started, 1)


async def bench(s: dict, run: dict, sides: list[Side], redis: Side | None, traced: Side) -> list[Row]:
    direct, baseline, proxy = sides
    tested = [baseline, proxy]
    results = run["results"]
    phase = Phases(run)
    test_cpu = proxy.cpu
    if test_cpu is not None:  # to tell how much other work shared the tested core
        busy, own, wall = procs.core_busy_seconds(test_cpu), sum(side.proc.cpu_seconds() for side in tested), time.monotonic()

    phase("warm-up", "a few calls and streams per side")
    for side in sides:
        client = side.client()
        await latencies(client, side, s["lat_n"], 20, stream=False)
        await latencies(client, side, s["first_n"], 20, stream=True, pace=s["first_pace"])
        client.close()
        await drive(side, n=s["sat_n"], concurrency=4, duration=0.5)
    await asyncio.sleep(1.0)
    rss_idle = {side.name: side.proc.rss_kb() for side in tested}

    # 6a first, while no load larger than the warm-up has run: RSS per open stream. Later
    # loads may reuse memory that earlier ones freed, which would hide some of it.
    rss_load = dict(n=s["rss_n"], concurrency=s["rss_streams"], pace=s["rss_pace"], spread=1.0)
    phase("6a", f"RSS per open stream: {s['rss_streams']} streams at {s['rss_pace']:g} chunks/s, {s['rss_n']} chunks each")
    rss = results["rss"] = {}
    for side in tested:
        load = await drive(side, **rss_load)
        rss[side.name] = {
            "idle_kb": rss_idle[side.name], "before_kb": load.rss_before_kb, "peak_kb": load.rss_peak_kb,
            "per_stream_kb": (load.rss_peak_kb - load.rss_before_kb) / s["rss_streams"], "failed": load.failed,
        }

    # 1, 2: one request at a time, interleaved rounds.
    phase("1-2", f"latency at concurrency 1: {s['lat_rounds']} rounds x {s['lat_per_round']} calls per side and kind")
    samples: dict[str, dict[str, list[float]]] = {kind: {side.name: [] for side in sides} for kind in ("call", "first")}
    clients = {side.name: side.client() for side in sides}
    for r in range(s["lat_rounds"]):
        for side in turn(sides, r):
            client = clients[side.name]
            samples["call"][side.name] += await latencies(client, side, s["lat_n"], s["lat_per_round"], stream=False)
            samples["first"][side.name] += await latencies(client, side, s["first_n"], s["lat_per_round"], stream=True, pace=s["first_pace"])
    for client in clients.values():
        client.close()
    for kind, by_side in samples.items():
        results[kind] = {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "samples": len(v)} for name, v in by_side.items()}

    # 3: CPU per event; paced streams below saturation, so that an upstream read carries one write.
    # The ratio is the median of the rounds' own: the core's speed drifts between rounds (the
    # other vCPU's load, the host's), and a round's two sides run back to back.
    cpu: dict[str, dict[str, Load]] = {}
    rounds: dict[str, list[float]] = {}
    reads: dict[str, int] = {}
    for k in (1, s["coalesce"]):
        phase(f"3-k{k}", f"CPU per event, {k} chunk(s) per upstream write: {s['cpu_rounds']} round(s) of {s['cpu_streams']} streams x {s['cpu_n']} chunks at {s['cpu_pace']}/s")
        totals = cpu[f"k{k}"] = {side.name: Load() for side in tested}
        ratios = rounds[f"k{k}"] = []
        before = await stats_reads(baseline)
        for r in range(s["cpu_rounds"]):
            per_event = {}
            for side in turn(tested, r):
                load = await drive(side, n=s["cpu_n"], concurrency=s["cpu_streams"], k=k, pace=s["cpu_pace"], spread=1 / s["cpu_pace"])
                totals[side.name].add(load)
                per_event[side.name] = load.cpu / max(load.events, 1)
            ratios.append(per_event["proxy"] / per_event["baseline"])
        reads[f"k{k}"] = await stats_reads(baseline) - before
    results["cpu"] = {
        mode: {
            "round_ratios": rounds[mode],
            **{
                name: {"us_per_event": load.cpu / load.events * 1e6, "cpu_share": load.cpu / load.wall, "events": load.events, "failed": load.failed, "errors": load.errors}
                for name, load in loads.items()
            },
        }
        for mode, loads in cpu.items()
    }
    for mode, count in reads.items():
        # Text chunks plus role, finish, usage and [DONE] per stream, over the baseline's reads.
        load = cpu[mode]["baseline"]
        results["cpu"][mode]["baseline"]["chunks_per_read"] = (load.events + 4 * load.streams) / max(count, 1)

    # 4: saturation: as fast as possible, stream after stream.
    phase("4", f"saturation: {s['sat_rounds']} round(s) x {s['sat_seconds']:g} s of {s['sat_streams']} concurrent streams, unpaced")
    sat = {side.name: Load() for side in sides}
    for r in range(s["sat_rounds"]):
        for side in turn(sides, r):
            sat[side.name].add(await drive(side, n=s["sat_n"], concurrency=s["sat_streams"], duration=s["sat_seconds"]))
    results["saturation"] = {
        name: {
            "events_per_s": load.events / load.wall,
            "events_per_cpu_s": load.events / load.cpu if load.cpu else None,
            "cpu_share": load.cpu / load.wall,
            "core_busy_share": load.core_busy / load.wall,
            "failed": load.failed,
            "errors": load.errors,
        }
        for name, load in sat.items()
    }

    # 5: concurrent paced streams, level by level; a side stops at its first failure.
    pace = s["level_pace"]
    max_gap = 10 / pace
    n = int(s["level_seconds"] * pace)
    levels: dict[str, list[dict]] = {side.name: [] for side in sides}
    alive = list(sides)
    for level in s["levels"]:
        if direct in alive and alive == [direct]:
            break  # the load generator's own ceiling matters only next to a tested side
        phase(f"5-{level}", f"{level} concurrent streams at {pace:g} chunks/s, {n} chunks each ({', '.join(side.name for side in alive)})")
        for side in turn(alive, level):
            load = await drive(side, n=n, concurrency=level, pace=pace, spread=s["level_spread"])
            ok = load.failed == 0 and max(load.max_gap, load.max_first) <= max_gap
            levels[side.name].append({
                "level": level, "ok": ok, "failed": load.failed, "max_gap_s": load.max_gap, "max_first_s": load.max_first,
                "rss_peak_kb": load.rss_peak_kb, "errors": load.errors,
                "other_work_share": max(load.core_busy - load.cpu, 0.0) / load.wall if side.cpu is not None else None,
            })
            if not ok:
                alive.remove(side)
            await asyncio.sleep(0.3)  # closed client connections leave the side
    results["levels"] = levels

    # 6b: RSS after all the load against before; then the 6a load once more: what that keeps is a leak.
    phase("6b", "RSS after the load, and after the RSS load once more")
    await asyncio.sleep(1.0)
    for side in tested:
        rss[side.name]["max_peak_kb"] = max([rss[side.name]["peak_kb"]] + [e["rss_peak_kb"] for e in levels[side.name]])
        rss[side.name]["after_kb"] = side.proc.rss_kb()
        await drive(side, **rss_load)
    await asyncio.sleep(1.0)
    for side in tested:
        rss[side.name]["after_repeat_kb"] = side.proc.rss_kb()

    # 7: the calls of 1 with their responses kept, in SQLite and in Redis, against store: false.
    kept = replace(proxy, name="sqlite", options={"store": True})
    store_sides = [proxy, kept] + ([redis] if redis else [])
    phase("7", f"keeping responses: {s['store_rounds']} rounds x {s['store_per_round']} calls and streams per store ({', '.join(side.name for side in store_sides)})")
    store = results["store"] = {side.name: {"call": [], "stream": [], "cpu_s": 0.0, "calls": 0} for side in store_sides}
    clients = {side.name: side.client() for side in store_sides}
    for r in range(s["store_rounds"]):
        for side in turn(store_sides, r):
            entry, client = store[side.name], clients[side.name]
            cpu = side.proc.cpu_seconds()
            entry["call"] += await latencies(client, side, s["lat_n"], s["store_per_round"], stream=False)
            entry["stream"] += await latencies(client, side, s["lat_n"], s["store_per_round"], stream=True, whole=True)
            entry["cpu_s"] += side.proc.cpu_seconds() - cpu
            entry["calls"] += 2 * s["store_per_round"]
    for client in clients.values():
        client.close()
    for entry in store.values():
        for kind in ("call", "stream"):
            entry[kind] = {"p50": pct(entry[kind], 0.5), "p99": pct(entry[kind], 0.99), "samples": len(entry[kind])}

    # 8: a background stream against the same stream kept in the foreground, in each store.
    pairs = [(kept, replace(kept, name="background", options={"store": True, "background": True}))]
    if redis:
        pairs.append((redis, replace(redis, name="background-redis", options={"store": True, "background": True})))
    bg_sides = [side for pair in pairs for side in pair]
    phase("8", f"background streams: CPU per event as 3 (one chunk per read) and time to the first event as 2, against the foreground ({', '.join(side.name for side in bg_sides)})")
    loads = {side.name: Load() for side in bg_sides}
    firsts: dict[str, list[float]] = {side.name: [] for side in bg_sides}
    clients = {side.name: side.client() for side in bg_sides}
    for r in range(s["cpu_rounds"]):
        for side in turn(bg_sides, r):
            loads[side.name].add(await drive(side, n=s["cpu_n"], concurrency=s["cpu_streams"], k=1, pace=s["cpu_pace"], spread=1 / s["cpu_pace"]))
            firsts[side.name] += await latencies(clients[side.name], side, s["first_n"], s["store_per_round"], stream=True, pace=s["first_pace"])
    for client in clients.values():
        client.close()
    results["background"] = {
        name: {"us_per_event": load.cpu / load.events * 1e6, "failed": load.failed, "errors": load.errors, "first_p50": pct(firsts[name], 0.5)}
        for name, load in loads.items()
    }
    # 9: tracing on against off, CPU per event as 3 (one chunk per read), interleaved rounds.
    phase("9", f"tracing on against off: {s['cpu_rounds']} round(s) of {s['cpu_streams']} streams x {s['cpu_n']} chunks at {s['cpu_pace']}/s")
    traced_loads = {side.name: Load() for side in (proxy, traced)}
    traced_ratios = []
    for r in range(s["cpu_rounds"]):
        per_event = {}
        for side in turn([proxy, traced], r):
            load = await drive(side, n=s["cpu_n"], concurrency=s["cpu_streams"], pace=s["cpu_pace"], spread=1 / s["cpu_pace"])
            traced_loads[side.name].add(load)
            per_event[side.name] = load.cpu / max(load.events, 1)
        traced_ratios.append(per_event["traced"] / per_event["proxy"])
    results["tracing"] = {
        "round_ratios": traced_ratios,
        **{name: {"us_per_event": load.cpu / max(load.events, 1) * 1e6, "failed": load.failed} for name, load in traced_loads.items()},
    }
    phase.close()
    if test_cpu is not None:
        others = procs.core_busy_seconds(test_cpu) - busy - (sum(side.proc.cpu_seconds() for side in tested) - own)
        run["other_work_on_test_cpu"] = max(others, 0.0) / (time.monotonic() - wall)
    return rows(s, results)


def rows(s: dict, results: dict) -> list[Row]:
    out = []
    limit = TARGETS["added_over_baseline_ms"]
    for kind, label, detail in (
        ("call", "non-streaming call", f"{s['lat_n']} tokens"),
        ("first", "time to first text event", f"streams of {s['first_n']} chunks at {s['first_pace']}/s"),
    ):
        r = results[kind]
        for q in ("p50", "p99"):
            added = {name: r[name][q] - r["direct"][q] for name in ("proxy", "baseline")}
            over = added["proxy"] - added["baseline"]
            target = q == "p50"
            out.append(Row(
                f"{label} {q}, added vs direct",
                ms(added["proxy"], True), ms(added["baseline"], True), ms(r["direct"][q]),
                ms(over, True),
                f"proxy vs baseline <= +{limit:g} ms" if target else "-",
                over * 1000 <= limit if target else None,
                (f"{r['proxy']['samples']} samples; " + detail) if target else "",
            ))
    for mode, label in (("k1", "1 chunk per read"), (f"k{s['coalesce']}", f"{s['coalesce']} chunks per write")):
        r = results["cpu"][mode]
        ratio = statistics.median(r["round_ratios"])
        failed = r["proxy"]["failed"] + r["baseline"]["failed"]
        note = (
            f"median of {len(r['round_ratios'])} rounds ({', '.join(f'{x:.2f}' for x in r['round_ratios'])}); CPU {r['proxy']['cpu_share']:.0%} vs"
            f" {r['baseline']['cpu_share']:.0%}; baseline {r['baseline']['chunks_per_read']:.2f} chunks/read"
        )
        note += f"; {failed} streams FAILED" if failed else ""
        cap = TARGETS["cpu_ratio"][mode]
        out.append(Row(
            f"CPU per text event, {label}",
            f"{r['proxy']['us_per_event']:.1f} us", f"{r['baseline']['us_per_event']:.1f} us", "-",
            f"{ratio:.2f}x", f"<= {cap:g}x", ratio <= cap and not failed, note,
        ))
    r = results["saturation"]
    ceiling = r["direct"]["events_per_s"]
    proxy = r["proxy"]
    bound = proxy["events_per_s"] >= UPSTREAM_BOUND * ceiling
    others = proxy["core_busy_share"] - proxy["cpu_share"]
    per_core = proxy["events_per_cpu_s"] or 0
    note = f"proxy {proxy['events_per_s']:,.0f}/s wall at {proxy['cpu_share']:.0%} CPU"
    if others > 0.05:
        note += f"; its core {others:.0%} busy outside it"
    if r["direct"]["events_per_cpu_s"]:
        note += f"; upstream alone {r['direct']['events_per_cpu_s']:,.0f}/s per core"
    if bound:
        note += "; UPSTREAM-BOUND"
    elif proxy["cpu_share"] < UPSTREAM_BOUND:
        note += "; not saturated"
    out.append(Row(
        "text events/s per core at saturation",
        f"{per_core:,.0f}", f"{r['baseline']['events_per_cpu_s'] or 0:,.0f}", f"{ceiling:,.0f} (ceiling)",
        f"{per_core / (r['baseline']['events_per_cpu_s'] or 1):.2f}x", f">= {TARGETS['events_per_core']:,}",
        per_core >= TARGETS["events_per_core"] and not proxy["failed"],
        note,
    ))
    levels = results["levels"]
    held = {name: max((e["level"] for e in entries if e["ok"]), default=0) for name, entries in levels.items()}

    def held_text(name: str) -> str:
        """A side that never failed held at least its last level."""
        entries = levels[name]
        return f">= {held[name]}" if entries and entries[-1]["ok"] else str(held[name])

    first_fail = next((e for e in levels["proxy"] if not e["ok"]), None)
    direct_failed_there = first_fail is not None and not any(e["level"] >= first_fail["level"] and e["ok"] for e in levels["direct"])
    note = f"{s['level_pace']:g} chunks/s, max wait <= {10 / s['level_pace'] * 1000:.0f} ms"
    if first_fail:
        note += (
            f"; at {first_fail['level']}: {first_fail['failed']} failed, longest wait for a first event"
            f" {first_fail['max_first_s'] * 1000:.0f} ms, between events {first_fail['max_gap_s'] * 1000:.0f} ms"
        )
        if (first_fail["other_work_share"] or 0) > 0.05:
            note += f"; its core {first_fail['other_work_share']:.0%} busy outside it"
    if direct_failed_there:
        note += "; UPSTREAM-BOUND"
    elif first_fail is None:
        note += "; every level held"
    out.append(Row(
        "concurrent paced streams held",
        held_text("proxy"), held_text("baseline"), held_text("direct"), "-",
        ">= the baseline's", held["proxy"] >= held["baseline"], note,
    ))
    p, b = results["rss"]["proxy"], results["rss"]["baseline"]
    # What a stream must hold for its done events (design.md 3.7): every score, as it came.
    chunks = generation(s["rss_n"], TOP_LOGPROBS).chunks()
    scores_kb = sum(len(orjson.dumps(c["choices"][0]["logprobs"]["content"])) for c in chunks if c["choices"] and c["choices"][0].get("logprobs")) / 1024
    out.append(Row(
        "RSS per open stream",
        f"{p['per_stream_kb']:.1f} kB", f"{b['per_stream_kb']:.1f} kB", "-",
        f"{p['per_stream_kb'] / b['per_stream_kb']:.2f}x" if b["per_stream_kb"] > 0 else "-",
        f"<= {TARGETS['rss_per_stream_kb']} kB", p["per_stream_kb"] <= TARGETS["rss_per_stream_kb"] and not p["failed"],
        f"(peak - before) / {s['rss_streams']} streams of {s['rss_n']} chunks at {s['rss_pace']:g}/s; a stream's scores, held for its done events: {scores_kb:.1f} kB at its end"
        + (f"; {p['failed']} FAILED" if p["failed"] else ""),
    ))

    def mb(kb: int) -> str:
        return f"{kb / 1024:.1f}"

    def kept(r: dict) -> tuple[float, float]:
        """Shares of the peak growth kept after the load, and added by the repeat."""
        growth = max(r["max_peak_kb"] - r["idle_kb"], 1)
        return (r["after_kb"] - r["idle_kb"]) / growth, (r["after_repeat_kb"] - r["after_kb"]) / growth

    after, leak = kept(p)
    base_after, base_leak = kept(b)
    out.append(Row(
        "RSS idle -> after load -> after repeat",
        f"{mb(p['idle_kb'])} -> {mb(p['after_kb'])} -> {mb(p['after_repeat_kb'])} MB",
        f"{mb(b['idle_kb'])} -> {mb(b['after_kb'])} -> {mb(b['after_repeat_kb'])} MB", "-",
        f"kept {after:.0%} vs {base_after:.0%}; repeat {leak:+.0%} vs {base_leak:+.0%}",
        f"repeat adds <= {TARGETS['retained_share']:.0%} of peak growth", leak <= TARGETS["retained_share"],
        f"shares of the peak growth ({mb(p['max_peak_kb'])} MB peak); the repeat is the RSS load",
    ))
    store = results["store"]
    plain = store["proxy"]
    for name, where, counted in (("sqlite", "SQLite", "the proxy's, its SQLite thread included"), ("redis", "Redis", "the proxy's; redis-server's own not counted")):
        if name not in store:
            out.append(Row(f"kept in {where}", "not measured", note="redis-server is not installed"))
            continue
        entry = store[name]
        cpu = entry["cpu_s"] / entry["calls"] - plain["cpu_s"] / plain["calls"]
        for kind, label in (("call", "non-streaming call"), ("stream", "stream to response.completed")):
            out.append(Row(
                f"{label} p50 kept in {where}, added vs store: false",
                ms(entry[kind]["p50"] - plain[kind]["p50"], True), "-", "-", "-", "-", None,
                f"{entry[kind]['samples']} samples, {s['lat_n']} tokens; CPU {cpu * 1e6:+.0f} us a call ({counted})",
            ))
    r = results["tracing"]
    out.append(Row(
        "tracing on: CPU per text event, vs off",
        f"{r['traced']['us_per_event']:.1f} us", "-", "-", f"{statistics.median(r['round_ratios']):.2f}x", "-", None,
        f"off {r['proxy']['us_per_event']:.1f} us; rounds {', '.join(f'{x:.2f}' for x in r['round_ratios'])}; a server and a client span a stream, exported over OTLP/HTTP"
        + (f"; {r['traced']['failed']} streams FAILED" if r["traced"]["failed"] else ""),
    ))
    r = results["background"]
    for foreground, background, where in (("sqlite", "background", "SQLite"), ("redis", "background-redis", "Redis")):
        if background not in r:
            continue
        fg, bg = r[foreground], r[background]
        failed = fg["failed"] + bg["failed"]
        out.append(Row(
            f"background stream in {where}: CPU per text event, vs kept in the foreground",
            f"{bg['us_per_event']:.1f} us", "-", "-", f"{bg['us_per_event'] / fg['us_per_event']:.2f}x", "-", None,
            f"foreground {fg['us_per_event']:.1f} us; first text event p50 {ms(bg['first_p50'] - fg['first_p50'], True)}" + (f"; {failed} streams FAILED" if failed else ""),
        ))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and levels (about a minute)")
    parser.add_argument("--out", default="bench-results/latest.json", help="JSON results (default: %(default)s)")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown, for the README")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--levels", help="comma-separated concurrent-stream levels for measure 5")
    parser.add_argument("--profile", metavar="PATH", help="run the proxy under cProfile, write its stats to PATH and print the top (numbers then are not comparable)")
    args = parser.parse_args(argv)
    s = dict(SETTINGS["quick" if args.quick else "full"])
    if args.levels:
        s["levels"] = [int(x) for x in args.levels.split(",")]
    out = Path(args.out)
    nofile = procs.raise_nofile()
    pinning = procs.Pinning()
    command = "python -m tests.bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": procs.machine(),
        "pinning": pinning.describe(),
        "open_files_limit": nofile,
        "settings": s,
        "targets": TARGETS,
        "results": {},
    }
    say(f"{run['command']}\n{run['machine']}\n{run['pinning']}")
    profile = Path(args.profile).resolve() if args.profile else None
    started = time.monotonic()
    running = procs.start_all(pinning, out.parent / "logs", profile)
    try:
        test_cpu = pinning.test_cpu if pinning.enabled else None
        sides = [
            Side("direct", running["upstream"].port, False, running["upstream"]),  # its CPU: the upstream's
            Side("baseline", running["baseline"].port, False, running["baseline"], test_cpu),
            Side("proxy", running["proxy"].port, True, running["proxy"], test_cpu),
        ]
        redis = running.get("proxy-redis")
        redis_side = Side("redis", redis.port, True, redis, test_cpu, options={"store": True}) if isinstance(redis, procs.Proc) else None
        try:
            import uvloop
        except ImportError:
            uvloop = None
        traced = running["proxy-traced"]
        assert isinstance(traced, procs.Proc)
        traced_side = Side("traced", traced.port, True, traced, test_cpu)
        table = (uvloop.run if uvloop else asyncio.run)(bench(s, run, sides, redis_side, traced_side))
    finally:
        procs.stop_all(running)
    run["seconds"] = round(time.monotonic() - started, 1)
    run["rows"] = as_json(table)
    header = (
        f"{run['command']}  ({run['date']}, {run['seconds']:g} s)\n"
        f"machine: {run['machine']['cpu']}, {run['machine']['cpus']} CPUs, Linux {run['machine']['kernel']}, "
        f"Python {run['machine']['python']}, load average at start {run['machine']['load_avg_at_start']:.2f}\n"
        f"{run['pinning']}"
        + (f"\nCPU {pinning.test_cpu} busy outside the tested processes (other work, softirq): {run['other_work_on_test_cpu']:.0%} of the run" if "other_work_on_test_cpu" in run else "")
    )
    print(header + "\n\n" + text_table(table))
    if args.markdown:
        run["markdown"] = markdown_table(table)
        print("\n" + header.replace("\n", "  \n") + "\n\n" + run["markdown"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(run, option=orjson.OPT_INDENT_2))
    print(f"\nwritten: {out}")
    if profile is not None:
        import pstats

        pstats.Stats(str(profile)).sort_stats("tottime").print_stats(25)
    return 1 if args.strict and any(row.ok is False for row in table) else 0


if __name__ == "__main__":
    sys.exit(main())
