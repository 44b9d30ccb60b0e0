"""`python -m tests.bench.placement [--products 3] [--sessions 6] [--turns 4] [--spacing 6] [--quick] [--markdown]`:
new sessions placed where their prompt's prefix is cached (design.md 11.5), on two real
llama-servers from the e2e cache (build it with `python -m tests.e2e.llama build`).

An agent product sends the same long prefix (its instructions and tool schemas) in every new
session. `--products` products of `--sessions` sessions each, interleaved (product 0's first, then
product 1's first, ...), a new session every `--spacing` seconds; each session `--turns` turns, a
short pause between them (the agent runs a tool), every turn resending the whole history
(`store: false`, the session in `prompt_cache_key`, as Codex does). Each run's prompts are new
text, so that no run finds another's prefixes in the caches. The runs:

- *ideal, pinned*: each session sent by hand to its replica in the ideal placement: the
  products laid end to end over the replicas, each taking an equal share of the sessions, so
  that a product's prefix is prefilled once on each replica it spans (the fewest copies at a
  max/mean of 1.00);
- *one proxy*: an upstream of both replicas (`balance: session`, the defaults);
- *two proxies, one Redis*: two proxy processes sharing a redis-server, a session's turns
  alternating between them (a stateless client behind a load balancer);
- with `--ref REV`, *one proxy at REV* too (the proxy of another revision).

Measured from the upstream's usage and a recorder in front of each llama-server (which replica
served each turn, by the request id the bench sends): first-turn prefill (prompt less cached
tokens, summed over the first turns) against the ideal computed from the workload (each
first turn's prompt less its product's shared prefix, plus that prefix once for each replica
the ideal placement puts the product on; the shared prefix counted by the llama-server's own
template and tokenizer); the prefix copies the first turns made (a product's first turn on a
replica); the prefill of all turns; the warm-return of continuing turns (those whose cache held
their previous turn's prompt, less 16 tokens of template) and the share of them that went back
to their previous turn's replica (the routing's part of it); turns per replica, max over mean;
time to the first text event of first and of later turns (p50); and the proxies' own count of
how sessions were routed (`proxy_session_routes_total`). Targets: first-turn prefill at most
1.10x the ideal, warm-return at least 0.95, max/mean at most 1.25. `--runs` picks the runs,
`--verbose` prints each first turn's replica and cached tokens and each continuing turn whose
cache did not hold its previous turn, `--llama="..."` sets the llama-servers' cache options.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.config import parse
from tests.e2e.llama import MODEL_ALIAS, running
from tests.harness import Spawned
from tests.redis_server import RedisServer

from .ab import export
from .affinity import WORDS, one_turn
from .procs import REPOSITORY
from .report import print_grid

TOPICS = ["parser", "scheduler", "billing", "search", "storage", "network", "renderer", "compiler", "auth", "cache"]
COLUMNS = (
    "run", "first-turn prefill", "ideal", "vs ideal", "prefix copies", "all turns' prefill", "warm-return", "back on replica",
    "turns per replica", "max/mean", "TTFT first p50", "TTFT later p50",
)


@dataclass
class Turn:
    product: int
    session: int
    index: int
    ttft: float
    prompt: int
    cached: int
    replica: int = -1


@dataclass
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)
    ideal: int = 0  # first-turn prefill of the ideal placement
    routes: Counter[str] = field(default_factory=Counter)  # the proxies' session routes, by outcome

    def first(self) -> list[Turn]:
        return [turn for turn in self.turns if turn.index == 0]

    def later(self) -> list[Turn]:
        return [turn for turn in self.turns if turn.index > 0]

    def prefill(self) -> int:
        return sum(turn.prompt - turn.cached for turn in self.first())

    def warm_return(self) -> float:
        later = self.later()
        return 1 - len(self.cold()) / len(later) if later else 1.0

    def cold(self) -> list[tuple[Turn, Turn]]:
        """Continuing turns whose cache did not hold their previous turn's prompt (less 16 tokens
        of template), each with that previous turn."""
        previous = {(turn.product, turn.session, turn.index): turn for turn in self.turns}
        pairs = [(turn, previous[turn.product, turn.session, turn.index - 1]) for turn in self.later()]
        return [(turn, before) for turn, before in pairs if turn.cached < before.prompt - 16]

    def back(self) -> float:
        """Continuing turns that went to the replica of their previous turn."""
        previous = {(turn.product, turn.session, turn.index): turn for turn in self.turns}
        back = [turn.replica == previous[turn.product, turn.session, turn.index - 1].replica for turn in self.later()]
        return sum(back) / len(back) if back else 1.0

    def copies(self) -> int:
        """The (product, replica) pairs of the first turns: each a prefill of a product's prefix."""
        return len({(turn.product, turn.replica) for turn in self.first()})

    def per_replica(self, replicas: int) -> list[int]:
        counted = Counter(turn.replica for turn in self.turns)
        return [counted[i] for i in range(replicas)]

    def row(self, replicas: int) -> list[str]:
        served = self.per_replica(replicas)
        spread = max(served) / (sum(served) / replicas)
        return [
            self.name, str(self.prefill()), str(self.ideal), f"{self.prefill() / self.ideal:.2f}x", str(self.copies()),
            str(sum(turn.prompt - turn.cached for turn in self.turns)),
            f"{self.warm_return():.2f}", f"{self.back():.2f}", " / ".join(map(str, served)), f"{spread:.2f}",
            f"{statistics.median(turn.ttft for turn in self.first()):.2f} s",
            f"{statistics.median(turn.ttft for turn in self.later()):.2f} s" if self.later() else "-",
        ]


class Recorder:
    """A llama-server behind a recorder: which request ids it served, and the chat bodies."""

    def __init__(self, upstream: str, index: int, served: dict[str, int], bodies: list[dict[str, Any]]) -> None:
        self.upstream, self.index, self.served, self.bodies = upstream, index, served, bodies

    async def handle(self, request: web.Request) -> web.StreamResponse:
        data = await request.read()
        self.served[request.headers.get("X-Request-ID", "")] = self.index
        self.bodies.append(orjson.loads(data))
        async with self.http.post(self.upstream + request.path, data=data, headers={"Content-Type": "application/json"}) as answer:
            response = web.StreamResponse(status=answer.status, headers={"Content-Type": answer.headers.get("Content-Type", "application/json")})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as self.http:
            try:
                yield f"http://127.0.0.1:{runner.addresses[0][1]}"
            finally:
                await runner.cleanup()


@dataclass(frozen=True)
class Workload:
    products: int
    sessions: int
    turns: int
    spacing: float
    words: int  # of a product's instructions

    def instructions(self, tag: str, product: int) -> str:
        rng = random.Random(f"{tag}/instructions/{product}")
        topic = TOPICS[product % len(TOPICS)]
        lines = [f"Run {tag}. You are the {topic} agent of product {product}."]
        while sum(len(line.split()) for line in lines) < self.words:
            lines.append(f"When the {topic} {rng.choice(WORDS)} {rng.choice(WORDS)}s, check the {rng.choice(WORDS)} first; " + " ".join(rng.choice(WORDS) for _ in range(12)) + ".")
        return "\n".join(lines)

    def tools(self, product: int) -> list[dict[str, Any]]:
        topic = TOPICS[product % len(TOPICS)]
        parameters = {"type": "object", "properties": {"path": {"type": "string"}, "query": {"type": "string"}}, "required": ["path"]}
        return [{"type": "function", "name": f"{topic}_{verb}", "description": f"{verb.capitalize()} a {topic} file.", "parameters": parameters} for verb in ("read", "search", "edit")]

    def order(self) -> list[tuple[int, int]]:
        """(product, session) in the order the sessions begin: products interleaved."""
        return [(product, session) for session in range(self.sessions) for product in range(self.products)]

    def pinned(self, replicas: int) -> dict[tuple[int, int], int]:
        """The ideal placement: the sessions, product after product, over the replicas in equal
        shares (the first ones taking one more where they do not divide)."""
        laid = [(product, session) for product in range(self.products) for session in range(self.sessions)]
        shares = [len(laid) // replicas + (i < len(laid) % replicas) for i in range(replicas)]
        placed, start = {}, 0
        for replica, share in enumerate(shares):
            for key in laid[start : start + share]:
                placed[key] = replica
            start += share
        return placed


async def conversation(
    http: aiohttp.ClientSession, urls: list[str], work: Workload, tag: str, product: int, session: int, model: str, run: Run
) -> None:
    rng = random.Random(f"{tag}/{product}/{session}")
    history: list[dict[str, Any]] = []
    key = f"{tag}.{product}.{session}"
    for index in range(work.turns):
        if index:
            await asyncio.sleep(rng.uniform(0.5, 1.5))  # the agent runs a tool
        said = {"type": "message", "role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "."}
        body = {
            "model": model, "instructions": work.instructions(tag, product), "tools": work.tools(product),
            "input": [*history, said], "store": False, "prompt_cache_key": key,
            "max_output_tokens": rng.randint(12, 32), "temperature": 0, "tool_choice": "none",
        }
        url = urls[(session * work.products + product + index) % len(urls)]
        ttft, final = await one_turn(http, url, body, {"X-Request-ID": f"{key}.{index}"})
        usage = final["usage"]
        run.turns.append(Turn(product, session, index, ttft, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]))
        answer = "".join(part["text"] for item in final["output"] if item["type"] == "message" for part in item["content"])
        history += [said, {"type": "message", "role": "assistant", "content": answer}]


async def shared_tokens(http: aiohttp.ClientSession, llama: str, bodies: list[dict[str, Any]]) -> int:
    """The tokens two first turns of one product share, by the server's template and tokenizer."""
    tokens = []
    for body in bodies[:2]:
        async with http.post(f"{llama}/apply-template", json={"messages": body["messages"], "tools": body.get("tools")}) as response:
            prompt = (await response.json())["prompt"]
        async with http.post(f"{llama}/tokenize", json={"content": prompt, "add_special": True, "parse_special": True}) as response:
            tokens.append((await response.json())["tokens"])
    return next((i for i, (a, b) in enumerate(zip(*tokens, strict=False)) if a != b), min(map(len, tokens)))


def upstream(name: str, urls: list[str]) -> dict[str, Any]:
    return {"name": name, "urls": urls, "dialect": "llama.cpp", "timeouts": {"first_byte": 600, "idle": 600}}


async def measure(args: argparse.Namespace, work: Workload) -> list[Run]:
    runs: list[Run] = []
    served: dict[str, int] = {}
    bodies: list[dict[str, Any]] = []
    state = Path(tempfile.mkdtemp(prefix="bench-placement-"))
    layouts = {"pinned": "ideal, pinned", "one": "one proxy", "two": "two proxies, one Redis", "ref": f"one proxy at {args.ref}"}
    chosen = [layouts[key] for key in args.runs.split(",") if key != "ref" or args.ref]
    async with AsyncExitStack() as stack:
        # One thread each: two servers share this machine's cores, as two GPUs would not. Each
        # server keeps every idle prompt in its prompt cache (--cache-ram, its default 8 GiB) and
        # starts each task from the longest it holds, as vLLM's and SGLang's caches do: with one
        # KV buffer for its slots (--kv-unified) an idle slot is saved there, and slots taken
        # least recently used (-sps 0) load from there. By default a slot is taken by similarity,
        # and sessions that share a long prefix overwrite each other's slot without saving it.
        options = ["--threads", "1", "--threads-batch", "1", *args.llama.split()]
        llamas = [
            await stack.enter_async_context(running("tools", ctx_size=args.ctx, parallel=args.slots, extra_args=options, ready_timeout=120))
            for _ in range(2)
        ]
        urls = [await stack.enter_async_context(Recorder(url, i, served, bodies).serving()) for i, url in enumerate(llamas)]
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)))
        redis = RedisServer(state)
        redis.start()
        stack.callback(redis.stop)
        old = export(args.ref, state / "ref") if args.ref else None
        for number, name in enumerate(chosen):
            tag = f"{int(time.time())}-{number}"
            run = Run(name)
            async with AsyncExitStack() as proxies:
                if name.startswith("ideal"):
                    config = {
                        "upstreams": [upstream(f"r{i}", [url]) for i, url in enumerate(urls)],
                        "routes": [{"model": f"pin-{i}", "upstream": f"r{i}", "rewrite_model": MODEL_ALIAS} for i in range(len(urls))],
                        "store": {"url": "none"},
                    }
                    entries = [await proxies.enter_async_context(proxy(config, state / f"{number}", REPOSITORY))]
                    pinned = work.pinned(len(urls))
                else:
                    shared = name.startswith("two")
                    store = {"url": redis.url, "prefix": f"bench-{tag}:"} if shared else {"url": "none"}
                    config = {"upstreams": [upstream("fleet", urls)], "store": store}
                    root = old if old is not None and name == layouts["ref"] else REPOSITORY
                    entries = [await proxies.enter_async_context(proxy(config, state / f"{number}-{i}", root)) for i in range(2 if shared else 1)]
                    pinned = {}
                started = []
                for product, session in work.order():
                    model = f"pin-{pinned[product, session]}" if pinned else MODEL_ALIAS
                    started.append(asyncio.create_task(conversation(http, entries, work, tag, product, session, model, run)))
                    await asyncio.sleep(work.spacing)
                await asyncio.gather(*started)
                run.routes = sum([await routes(http, entry) for entry in entries], Counter())
            for turn in run.turns:
                turn.replica = served[f"{tag}.{turn.product}.{turn.session}.{turn.index}"]
            run.ideal = await ideal(http, llamas[0], work, run, bodies, tag)
            runs.append(run)
            if args.verbose:
                for turn in sorted(run.first(), key=lambda turn: (turn.session, turn.product)):
                    print(f"  first turn of {turn.product}.{turn.session}: replica {turn.replica}, {turn.prompt} tokens, {turn.cached} cached, TTFT {turn.ttft:.1f} s")
                for turn, before in run.cold():
                    print(f"  cold turn {turn.index} of {turn.product}.{turn.session}: replica {turn.replica} (before: {before.replica}), {turn.cached} cached of the {before.prompt} before")
            print(f"{name}: " + ", ".join(f"{column} {cell}" for column, cell in zip(COLUMNS[1:], run.row(len(urls))[1:], strict=True)), flush=True)
            if run.routes:
                print(f"  the proxies' session routes: {dict(run.routes)}", flush=True)
    return runs


async def ideal(http: aiohttp.ClientSession, llama: str, work: Workload, run: Run, bodies: list[dict[str, Any]], tag: str) -> int:
    """The first-turn prefill of the ideal placement, from this run's own prompts."""
    copies = Counter(product for product, _ in {(key[0], replica) for key, replica in work.pinned(2).items()})
    total = 0
    for product in range(work.products):
        head = f"Run {tag}. You are the {TOPICS[product % len(TOPICS)]} agent of product {product}."
        firsts = [body for body in bodies if len(body["messages"]) == 2 and str(body["messages"][0]["content"]).startswith(head)]
        shared = await shared_tokens(http, llama, firsts)
        print(f"  product {product}: {shared} tokens shared by its first turns, on {copies[product]} replica(s) in the ideal placement")
        total += sum(turn.prompt - shared for turn in run.first() if turn.product == product) + copies[product] * shared
    return total


async def routes(http: aiohttp.ClientSession, url: str) -> Counter[str]:
    """A proxy's `proxy_session_routes_total`, by outcome."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("proxy_session_routes_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] += int(float(line.rsplit(" ", 1)[1]))
    return found


@asynccontextmanager
async def proxy(config: dict[str, Any], folder: Path, root: Path) -> AsyncIterator[str]:
    """A proxy process of the tree at `root`, for `config` (as written: another revision's proxy
    may not know this one's keys)."""
    parse(config)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "proxy.json"
    path.write_bytes(orjson.dumps(config))
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    spawned = await Spawned.start([sys.executable, "-m", "proxy"], path, cwd=folder, env=env)
    try:
        yield spawned.url
    finally:
        await spawned.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--products", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=6, help="a product")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--spacing", type=float, default=6.0, help="seconds between new sessions")
    parser.add_argument("--words", type=int, default=1300, help="of a product's instructions (with its tools, about 2.2k tokens)")
    parser.add_argument("--quick", action="store_true", help="3 products of 3 sessions, 3 turns: a few minutes")
    parser.add_argument("--slots", type=int, default=2, help="llama-server slots (-np) a replica")
    parser.add_argument("--ctx", type=int, default=16384, help="llama-server context, shared by its slots")
    parser.add_argument("--llama", default="--kv-unified -sps 0", help="llama-server's cache options, as --llama=\"...\" (default: %(default)s)")
    parser.add_argument("--ref", help="also run the proxy of this git revision")
    parser.add_argument("--runs", default="pinned,one,two,ref", help="which runs, of pinned, one, two, ref (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="each first turn's replica and cached tokens")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.products, args.sessions, args.turns = 3, 3, 3
    work = Workload(args.products, args.sessions, args.turns, args.spacing, args.words)
    runs = asyncio.run(measure(args, work))
    header = (
        f"{work.products} products x {work.sessions} sessions x {work.turns} turns, a new session every {work.spacing:g} s; "
        f"2 llama-servers ({args.slots} slots, 1 thread each); the ideal of each run's own prompts"
    )
    print_grid(header, COLUMNS, [run.row(2) for run in runs], args.markdown)


if __name__ == "__main__":
    main()
