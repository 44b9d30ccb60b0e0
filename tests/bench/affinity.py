"""`python -m tests.bench.affinity [--sessions 4] [--turns 6] [--rounds 1] [--markdown]`:
sessions across a fleet of two real llama-servers (design.md 11), from the e2e cache (build it
with `python -m tests.e2e.llama build`).

An agent-like load: `--sessions` conversations run at once, each `--turns` turns one after the
other, every turn resending the whole history (`store: false`, as Codex does), with the session
in `prompt_cache_key` and a `session-id` header; and the same chained with `previous_response_id`
(`store: true`, the history in the proxy's store, no key). Each is run through the proxy routing
by session (`balance: session`), through the proxy balancing each request alone
(`least_outstanding`), and with each session pinned to one replica by hand (two upstreams, a
route a session): the bar. Every run's conversations are new text, so that no run finds another's
prefixes in the caches (the shared instructions aside, as for a real agent).

Measured per run, from the upstream's own usage: the warm-return rate (continuation turns that
found their previous turn's prompt in the cache of the replica they went to), cached / prompt
tokens, the tokens prefilled (prompt less cached), the time to the first text event of the
continuation turns (p50, p95), and the CPU the two llama-servers spent.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.config import Config, parse
from tests.e2e.llama import MODEL_ALIAS, running
from tests.harness import Running

INSTRUCTIONS = (
    "You are a careful coding agent working in a repository. Read the task, plan, then answer briefly. "
    "Prefer small, reviewed changes; keep tests green; explain what you changed and why. "
) * 6
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "river", "stone", "cloud", "ember"]
CLOCK_TICKS = 100  # of /proc/PID/stat's utime and stime


@dataclass
class Turn:
    session: int
    index: int
    ttft: float
    prompt: int
    cached: int


@dataclass
class Run:
    name: str
    round: int
    turns: list[Turn] = field(default_factory=list)
    llama_cpu: float = 0.0

    def continuations(self) -> list[Turn]:
        return [turn for turn in self.turns if turn.index > 0]

    def warm_return(self) -> float:
        """Continuation turns whose cache held at least their previous turn's prompt, less the
        template's last few tokens (the generation prompt, re-rendered)."""
        previous = {(turn.session, turn.index): turn for turn in self.turns}
        warm = [turn.cached >= previous[turn.session, turn.index - 1].prompt - 16 for turn in self.continuations()]
        return sum(warm) / len(warm)

    def cached_share(self) -> float:
        return sum(turn.cached for turn in self.turns) / sum(turn.prompt for turn in self.turns)

    def prefilled(self) -> int:
        return sum(turn.prompt - turn.cached for turn in self.turns)

    def ttft(self, quantile: float) -> float:
        times = sorted(turn.ttft for turn in self.continuations())
        return times[min(len(times) - 1, round(quantile * (len(times) - 1)))]


def seconds(value: float) -> str:
    return f"{value:.2f} s"


def user_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def llama_pids() -> dict[int, int]:
    """The running llama-servers' pids, by the port they listen on."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"llama-server" in argv[0].rsplit(b"/", 1)[-1] and b"--port" in argv:
            found[int(argv[argv.index(b"--port") + 1])] = int(proc.name)
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


async def one_turn(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """A streamed call: the time to its first text event, and the final Response."""
    started = time.monotonic()
    first = None
    async with http.post(f"{url}/v1/responses", json={**body, "stream": True}, headers=headers) as response:
        assert response.status == 200, await response.text()
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                data = frame.partition(b"data: ")[2]
                if first is None and b'"response.output_text.delta"' in data:
                    first = time.monotonic() - started
                if b'"type":"response.completed"' in data or b'"type":"response.incomplete"' in data:
                    final = orjson.loads(data)["response"]
    assert first is not None, "no text came"
    return first, final


async def conversation(http: aiohttp.ClientSession, url: str, session: int, turns: int, chained: bool, model: str, run: Run, seed: str) -> None:
    rng = random.Random(f"{seed}/{session}")
    history: list[dict[str, Any]] = []
    previous = None
    key = f"{seed}-session-{session}"
    # The instructions every session of a run shares (an agent's), new in each run: no run
    # starts with another's prefix in the caches.
    instructions = f"Run {seed}. {INSTRUCTIONS}"
    for index in range(turns):
        if index:
            await asyncio.sleep(rng.uniform(0.0, 1.5))  # the agent runs a tool between turns
        # Turns of unlike sizes: sessions drift apart, as real ones do, instead of moving in step.
        said = {"type": "message", "role": "user", "content": user_text(rng, rng.randint(20, 200))}
        limit = rng.randint(8, 48)
        body: dict[str, Any] = {"model": model, "instructions": instructions, "max_output_tokens": limit, "temperature": 0}
        headers = {}
        if chained:
            body |= {"input": [said], "store": True, **({"previous_response_id": previous} if previous else {})}
        else:
            body |= {"input": [*history, said], "store": False, "prompt_cache_key": key}
            headers = {"session-id": key}
        ttft, final = await one_turn(http, url, body, headers)
        usage = final["usage"]
        run.turns.append(Turn(session, index, ttft, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]))
        answer = "".join(part["text"] for item in final["output"] if item["type"] == "message" for part in item["content"])
        history += [said, {"type": "message", "role": "assistant", "content": answer}]
        previous = final["id"]


def fleet_config(urls: list[str], layout: str, store: Path) -> Config:
    stored = {"url": f"sqlite:{store}"}
    timeouts = {"first_byte": 600, "idle": 600}
    if layout == "pinned":
        upstreams = [{"name": f"r{i}", "urls": [url], "dialect": "llama.cpp", "timeouts": timeouts} for i, url in enumerate(urls)]
        routes = [{"model": f"pin-{i}", "upstream": f"r{i}", "rewrite_model": MODEL_ALIAS} for i in range(len(urls))]
        return parse({"upstreams": upstreams, "routes": routes, "store": stored})
    upstream = {"name": "fleet", "urls": urls, "dialect": "llama.cpp", "balance": layout, "timeouts": timeouts}
    return parse({"upstreams": [upstream], "store": stored})


@asynccontextmanager
async def two_llama_servers(slots: int, ctx: int) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        # One thread each: two servers share this machine's cores, as two GPUs would not.
        threads = ["--threads", "1", "--threads-batch", "1"]
        urls = [
            await stack.enter_async_context(running("tools", ctx_size=ctx, parallel=slots, extra_args=threads, ready_timeout=120))
            for _ in range(2)
        ]
        yield urls


async def measure(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    async with two_llama_servers(args.slots, args.ctx) as urls, aiohttp.ClientSession() as http:
        pids = [llama_pids()[int(url.rsplit(":", 1)[1])] for url in urls]
        for round_ in range(args.rounds):
            for chained in (False, True):
                for layout in ("pinned", "session", "least_outstanding"):
                    if chained and layout == "pinned":
                        continue  # the chain needs one store for all turns: the stateless pinned run is the bar
                    name = f"{layout}, {'chained' if chained else 'stateless'}"
                    run = Run(name, round_)
                    store = Path(args.state) / f"{round_}-{layout}-{chained}.db"
                    proxy = await Running.start(fleet_config(urls, layout, store))
                    try:
                        before = cpu_seconds(pids)
                        seed = f"{round_}-{layout}-{chained}"
                        await asyncio.gather(*(
                            conversation(http, proxy.url, s, args.turns, chained, f"pin-{s % 2}" if layout == "pinned" else MODEL_ALIAS, run, seed)
                            for s in range(args.sessions)
                        ))
                        run.llama_cpu = cpu_seconds(pids) - before
                    finally:
                        await proxy.runner.cleanup()
                    runs.append(run)
                    print(f"{name}: warm-return {run.warm_return():.2f}, cached/prompt {run.cached_share():.3f}, "
                          f"prefilled {run.prefilled()}, continuation TTFT p50 {seconds(run.ttft(0.5))} p95 {seconds(run.ttft(0.95))}, "
                          f"llama CPU {run.llama_cpu:.1f} s", flush=True)
    return runs


def table(runs: list[Run]) -> list[list[str]]:
    bars = {run.round: run for run in runs if run.name.startswith("pinned")}  # each round against its own
    rows = []
    for run in runs:
        pinned = bars.get(run.round)
        versus = ""
        if pinned is not None and run is not pinned:
            versus = f"prefilled {run.prefilled() / pinned.prefilled():.2f}x, p95 {run.ttft(0.95) / pinned.ttft(0.95):.2f}x pinned"
        rows.append([
            str(run.round + 1), run.name, f"{run.warm_return():.2f}", f"{run.cached_share():.3f}", str(run.prefilled()),
            f"{seconds(run.ttft(0.5))} / {seconds(run.ttft(0.95))}", f"{run.llama_cpu:.1f} s", versus,
        ])
    return rows


def markdown(rows: list[list[str]]) -> str:
    lines = [HEADERS, ["---"] * len(HEADERS), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def plain(rows: list[list[str]]) -> str:
    widths = [max(len(cells[i]) for cells in [HEADERS, *rows]) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) for cells in [HEADERS, *rows])


HEADERS = ["round", "run", "warm-return", "cached / prompt", "tokens prefilled", "continuation TTFT p50 / p95", "llama CPU", "against pinned"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2, help="llama-server slots (-np) a replica")
    parser.add_argument("--ctx", type=int, default=8192, help="llama-server context, shared by its slots")
    parser.add_argument("--state", default="bench-results/affinity", help="where the runs' stores go")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    Path(args.state).mkdir(parents=True, exist_ok=True)
    runs = asyncio.run(measure(args))
    rows = table(runs)
    print(markdown(rows) if args.markdown else plain(rows))


if __name__ == "__main__":
    main()
