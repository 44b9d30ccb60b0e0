"""The real process, `python -m proxy`: SIGHUP reload, SIGTERM drain, workers on one port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.client import envelope, eventually, output_text, parse_sse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import START_TIMEOUT, Spawned, sample, scrape

ROOT = Path(__file__).resolve().parent.parent
PYTHON_M = (sys.executable, "-m", "proxy")
CONSOLE_SCRIPT = Path(sys.executable).with_name("responses-proxy")  # what the Dockerfile runs
GEN = Generation(steps=[Step("text", "Hi"), Step("finish", finish_reason="stop")])
WORDS = [f"w{i} " for i in range(12)]
SLOW = Generation(steps=[*(Step("text", w) for w in WORDS), Step("finish", finish_reason="stop")])


def fresh() -> aiohttp.ClientSession:
    """A session that opens a new connection for every request."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=10))


async def chat_status(url: str, model: str, content: str = "hi") -> int:
    async with fresh() as http:
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            await response.read()
            return response.status


async def refuses(url: str) -> bool:
    """True once a new connection is refused; an answered or otherwise failed attempt is not."""
    try:
        async with fresh() as http, http.get(f"{url}/health") as response:
            await response.read()
    except aiohttp.ClientConnectorError:
        return True
    except aiohttp.ClientError:
        pass
    return False


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start `python -m proxy --config FILE` on a free port, wait for /health; killed at the end."""
    started: list[Spawned] = []

    async def start(config: dict, *args: str, command: tuple[str, ...] = PYTHON_M) -> Spawned:
        path = tmp_path / f"proxy-{len(started)}.yaml"
        path.write_text(yaml.safe_dump(config))
        started.append(await Spawned.start(command, path, *args, cwd=tmp_path))
        return started[-1]

    yield start
    for proxy in started:
        await proxy.kill()


UPSTREAM_KEY = "sk-upstream-5e6f"


def routes(upstream: FakeUpstream, *models: str, **top: Any) -> dict:
    upstreams = [{"name": "u", "urls": [upstream.url], "api_key": UPSTREAM_KEY}]
    return {"upstreams": upstreams, "routes": [{"model": m, "upstream": "u"} for m in models], **top}


async def test_sighup_takes_a_valid_file_and_keeps_the_config_on_a_broken_one(upstream, spawn) -> None:
    upstream.script(Reply(GEN))
    proxy = await spawn(routes(upstream, "alpha"), "--log-level", "debug")
    assert (await chat_status(proxy.url, "alpha"), await chat_status(proxy.url, "beta")) == (200, 404)

    config = routes(upstream, "alpha")
    config["routes"].append({"model": "beta", "upstream": "u", "rewrite_model": "beta-large"})
    proxy.write(config)
    proxy.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: "config reloaded" in proxy.stderr())
    assert await chat_status(proxy.url, "beta") == 200
    assert upstream.requests[-1]["model"] == "beta-large"

    proxy.write("upstreams:\n  - name: u\n    urls: [not-a-url]\n")
    proxy.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: "config reload failed" in proxy.stderr())
    assert "upstreams[0].urls[0]" in proxy.stderr()
    assert proxy.proc.returncode is None
    assert (await chat_status(proxy.url, "alpha"), await chat_status(proxy.url, "beta")) == (200, 200)
    assert upstream.requests[-1]["model"] == "beta-large"
    assert upstream.headers[-1]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert UPSTREAM_KEY not in proxy.stderr()


@pytest.mark.parametrize(
    ("change", "status"), [({"auth": {"api_keys": ["k"]}}, 401), ({"max_body_bytes": 1024}, 413)], ids=["auth", "max_body_bytes"]
)
async def test_sighup_applies_the_request_limits(upstream, spawn, change: dict, status: int) -> None:
    upstream.script(Reply(GEN))
    proxy = await spawn(routes(upstream, "m"))
    assert await chat_status(proxy.url, "m", "x" * 1500) == 200
    proxy.write({**routes(upstream, "m"), **change})
    proxy.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: "config reloaded" in proxy.stderr())
    answered = await chat_status(proxy.url, "m", "x" * 1500)
    assert len(upstream.requests) == 1  # refused by the proxy, as the new file says
    assert answered == status


async def test_sigterm_drains_with_ready_503_and_new_work_refused_then_exits_0(upstream, spawn) -> None:
    """design.md 5.10: the listener stays open through the drain, so probes see /ready turn 503
    and new generations get a 503 to retry elsewhere, while the stream in flight finishes."""
    upstream.script(Reply(SLOW, delay=0.1))  # about 1.5 s of stream
    grace = 10
    proxy = await spawn(routes(upstream, shutdown_grace=grace))
    async with fresh() as http, http.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi", "stream": True}) as response:
        assert response.status == 200
        received = await response.content.readany()
        await eventually(lambda: upstream.active_streams == 1)
        proxy.proc.send_signal(signal.SIGTERM)

        async def ready_is(status: int) -> bool:
            async with fresh() as probe, probe.get(f"{proxy.url}/ready") as answer:
                return answer.status == status

        await eventually(lambda: ready_is(503), timeout=5)
        async with fresh() as other, other.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi"}) as refused:
            assert refused.status == 503
            assert (await refused.json())["error"]["code"] == "server_shutting_down"
        assert upstream.active_streams == 1  # all that while, the stream ran on
        received += await response.read()
    events = parse_sse(received)
    assert events[-1]["type"] == "response.completed"
    assert output_text(events[-1]["response"])["text"] == "".join(WORDS)
    assert await asyncio.wait_for(proxy.proc.wait(), grace) == 0
    assert "draining" in proxy.stderr()


@pytest.mark.parametrize("grace", [0.5, 0])
async def test_sigterm_ends_a_stream_that_outlives_the_grace(upstream, spawn, grace: float) -> None:
    """At the grace, a stream still open gets `response.failed` and `[DONE]` (not a cut),
    its upstream request is closed, and the process exits within a second more."""
    upstream.script(Reply(SLOW, stall_after=2))
    proxy = await spawn(routes(upstream, shutdown_grace=grace))
    async with fresh() as http, http.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi", "stream": True}) as response:
        await eventually(lambda: upstream.active_streams == 1)
        signalled = asyncio.get_running_loop().time()
        proxy.proc.send_signal(signal.SIGTERM)
        events = parse_sse(await response.read())
        assert await asyncio.wait_for(proxy.proc.wait(), grace + 5) == 0
        assert asyncio.get_running_loop().time() - signalled < grace + 1.5
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "server_shutting_down"
    await asyncio.wait_for(upstream.disconnected.wait(), 5)  # the upstream request was closed, not left running


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_sigterm_ends_a_request_still_waiting_for_upstream_headers(upstream, spawn, stream: bool) -> None:
    """A long queue or prefill before the upstream's headers: at the grace, a 503 in the
    envelope (its stream had not begun), not a cut connection, and an exit within a second more.
    A request that waited for a place in the pool meanwhile is not sent once it gets one."""
    grace = 0.5
    upstream.choose = lambda _: Reply(SLOW, headers_delay=60)
    config = routes(upstream, shutdown_grace=grace)
    config["upstreams"][0] |= {"max_connections": 1, "timeouts": {"connect": 30}}
    proxy = await spawn(config)
    async with fresh() as http:
        body = {"model": "m", "input": "hi", "stream": stream}
        first = asyncio.create_task(http.post(f"{proxy.url}/v1/responses", json=body))
        await eventually(lambda: len(upstream.requests) == 1)
        second = asyncio.create_task(http.post(f"{proxy.url}/v1/responses", json=body))  # waits for the pool
        await asyncio.sleep(0.2)
        signalled = asyncio.get_running_loop().time()
        proxy.proc.send_signal(signal.SIGTERM)
        for answer in (first, second):
            async with await answer as response:
                assert response.status == 503
                envelope(await response.json(), "server_shutting_down")
        assert await asyncio.wait_for(proxy.proc.wait(), grace + 5) == 0
        assert asyncio.get_running_loop().time() - signalled < grace + 1.5
    await asyncio.wait_for(upstream.disconnected.wait(), 5)  # the upstream request was closed
    assert len(upstream.requests) == 1


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on `port` (IPv4)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(fields[9])
    return inodes


def sockets_of(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(link[len("socket:[") : -1])
    return found


def worker_pids(proxy: Spawned) -> list[int]:
    """The proxy's worker processes (not multiprocessing's resource tracker)."""
    pids = []
    for pid in children(proxy.proc.pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def each_worker_listens(proxy: Spawned) -> bool:
    port = int(proxy.url.rsplit(":", 1)[1])
    listening, workers = listening_sockets(port), worker_pids(proxy)
    return len(workers) == 2 and len(listening) == 2 and all(sockets_of(pid) & listening for pid in workers)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("command", [PYTHON_M, (str(CONSOLE_SCRIPT),)], ids=["python-m-proxy", "responses-proxy"])
async def test_two_workers_share_the_port_and_exit_0_on_sigterm(upstream, spawn, command: tuple[str, ...]) -> None:
    if not Path(command[0]).exists():
        pytest.skip(f"{command[0]} is not installed")
    upstream.script(Reply(GEN))
    proxy = await spawn(routes(upstream, "m"), "--workers", "2", command=command)
    await eventually(lambda: each_worker_listens(proxy), START_TIMEOUT)
    pids = worker_pids(proxy)
    for _ in range(4):
        assert await chat_status(proxy.url, "m") == 200
    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proxy.proc.wait(), 15) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert proxy.stderr().count("draining") == 2


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
async def test_metrics_add_up_over_the_workers(upstream, spawn) -> None:
    """Every scrape, whichever worker answers it, shows the calls of all of them: 20 new
    connections spread over two workers (each taking all 20 is a chance of one in 500 000)."""
    upstream.script(Reply(GEN))
    proxy = await spawn(routes(upstream, "m"), "--workers", "2")
    await eventually(lambda: each_worker_listens(proxy), START_TIMEOUT)
    for _ in range(20):
        assert await chat_status(proxy.url, "m") == 200
    for _ in range(6):
        async with fresh() as http:
            metrics = await scrape(http, proxy.url)
        served = sample(metrics, "proxy_requests_total", route="m", endpoint="/v1/chat/completions", status="200")
        assert served == 20
        assert sample(metrics, "proxy_streams_in_flight") == 0


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
async def test_a_worker_killed_by_a_signal_stops_the_proxy_with_a_failure(upstream, spawn) -> None:
    proxy = await spawn(routes(upstream, "m"), "--workers", "2")
    await eventually(lambda: len(worker_pids(proxy)) == 2, START_TIMEOUT)
    survivor = worker_pids(proxy)[1]
    os.kill(worker_pids(proxy)[0], signal.SIGKILL)
    # The proxy stops whole, so that the orchestrator restarts it, and says it failed.
    assert await asyncio.wait_for(proxy.proc.wait(), 15) != 0
    assert not Path(f"/proc/{survivor}").exists()


def test_a_broken_config_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("upstreams:\n  - name: u\n    urls: [http://a]\nroutes:\n  - model: m\n    upstream: nope\n")
    result = subprocess.run([sys.executable, "-m", "proxy", "--config", str(path)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert result.returncode != 0
    assert "routes[0].upstream" in result.stderr


async def test_two_processes_share_their_responses_through_redis(upstream, spawn, redis_server) -> None:
    """design.md 9.1: a response created on one replica is read and chained on the other."""
    config = {"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": {"url": redis_server.url, "prefix": "two-processes:"}}
    one, other = await spawn(config), await spawn(config)
    upstream.script(Reply(Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")])))
    async with fresh() as http:
        async with http.post(f"{one.url}/v1/responses", json={"model": "m", "input": "hello", "stream": True}) as response:
            first = parse_sse(await response.read())[-1]["response"]
        async with http.post(f"{other.url}/v1/responses", json={"model": "m", "input": "again", "previous_response_id": first["id"]}) as response:
            assert response.status == 200, await response.text()
            second = await response.json()
        assert [m["content"] for m in upstream.requests[-1]["messages"]] == ["hello", "Hi", "again"]
        for url, id in ((other.url, first["id"]), (one.url, second["id"])):
            async with http.get(f"{url}/v1/responses/{id}") as response:
                assert response.status == 200 and (await response.json())["id"] == id
        async with http.get(f"{one.url}/v1/responses/{second['id']}/input_items") as response:
            assert [item["content"][0]["text"] for item in (await response.json())["data"]] == ["again"]


async def test_header_dribblers_lock_no_one_out(upstream, spawn) -> None:
    """design.md 5.11: with few file descriptors (ulimit -n 256), 300 clients dribbling their
    headers a line at a time are refused past the connection limit or dropped at the header
    timeout, and a client that keeps to time is served."""
    upstream.script(Reply(Generation([Step("text", "Hi"), Step("finish", finish_reason="stop")])))
    proxy = await spawn(routes(upstream, connections={"header_timeout": 1.0}), command=("prlimit", "--nofile=256", *PYTHON_M))
    host, port = proxy.url.removeprefix("http://").split(":")
    stop = asyncio.Event()

    async def dribble() -> None:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not writer.is_closing():
                await asyncio.sleep(0.2)
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
            writer.close()

    dribblers = [asyncio.create_task(dribble()) for _ in range(300)]
    try:
        await asyncio.sleep(1.5)
        async with fresh() as http, asyncio.timeout(5), http.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi"}) as response:
            assert response.status == 200
        assert proxy.proc.returncode is None
        log = proxy.stderr()
        assert "refused a connection" in log and "no request headers within 1 s" in log
        assert log.count("refused a connection") < 10  # a line a second at most
    finally:
        stop.set()
        await asyncio.gather(*dribblers)


async def _start_background(http: aiohttp.ClientSession, url: str, upstream: FakeUpstream) -> str:
    """A background response's id, once its run is generating."""
    async with http.post(f"{url}/v1/responses", json={"model": "m", "input": "hi", "background": True}) as response:
        id = (await response.json())["id"]
    await eventually(lambda: upstream.active_streams == 1)
    return str(id)


async def _all_events(http: aiohttp.ClientSession, url: str, id: str) -> list[dict[str, Any]]:
    async with http.get(f"{url}/v1/responses/{id}?stream=true&starting_after=-1") as response:
        assert response.status == 200, await response.text()
        return parse_sse(await response.read())


async def test_sigterm_ends_a_background_run_failed_past_the_grace(upstream, spawn, tmp_path) -> None:
    """design.md 10.4: SIGTERM drains background runs like streams; what outlives the grace
    ends failed (`server_shutting_down`), kept so that any replica reads it so."""
    store = {"url": f"sqlite:{tmp_path}/shared.db"}
    config = {"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store, "shutdown_grace": 0.5}
    runner, other = await spawn(config), await spawn(config)
    upstream.script(Reply(SLOW, stall_after=2))
    async with fresh() as http:
        id = await _start_background(http, runner.url, upstream)
        runner.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(runner.proc.wait(), 5) == 0
        events = await _all_events(http, other.url, id)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"] and events[-2]["code"] == "server_shutting_down"
    assert events[-1]["response"]["status"] == "failed"
    await asyncio.wait_for(upstream.disconnected.wait(), 5)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_a_killed_replica_s_background_response_is_failed_by_another(upstream, spawn, tmp_path, redis_server, backend: str) -> None:
    """design.md 10.4: SIGKILL the replica that runs a background response; the other takes its
    expired lease over and ends it failed, from its last stored state, after its last event."""
    store = {"url": f"sqlite:{tmp_path}/shared.db"} if backend == "sqlite" else {"url": redis_server.url, "prefix": "killed:"}
    config = {"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store, "background": {"lease": 1.0, "snapshot_interval": 0.1}}
    runner, other = await spawn(config), await spawn(config)
    upstream.script(Reply(SLOW, stall_after=4))
    async with fresh() as http:
        id = await _start_background(http, runner.url, upstream)
        await asyncio.sleep(0.3)  # a snapshot of the words so far
        os.killpg(runner.proc.pid, signal.SIGKILL)
        killed = asyncio.get_running_loop().time()
        events = await _all_events(http, other.url, id)
        assert asyncio.get_running_loop().time() - killed < 3  # a lease and a half, and a read
        assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        assert failed["usage"]["total_tokens"] == 0  # unknown, but an object (design.md 5.1)
        assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "".join(WORDS[:3])
        async with http.get(f"{other.url}/v1/responses/{id}") as response:
            assert (await response.json())["status"] == "failed"


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_a_stale_replica_that_resumes_cannot_write_over_the_run_another_ended(upstream, spawn, tmp_path, redis_server, backend: str) -> None:
    """design.md 10.4: a replica stopped (SIGSTOP) past its lease is taken for dead, and another
    ends its run failed; resumed, its writes (its snapshot, events, its own cancelled ending) are
    refused by the lease's fencing token, and its generation stops."""
    store = {"url": f"sqlite:{tmp_path}/shared.db"} if backend == "sqlite" else {"url": redis_server.url, "prefix": f"stale-{tmp_path.name}:"}
    config = {"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store, "background": {"lease": 1.0, "snapshot_interval": 0.1}}
    runner, other = await spawn(config), await spawn(config)
    upstream.script(Reply(SLOW, stall_after=4))
    async with fresh() as http:
        id = await _start_background(http, runner.url, upstream)
        await asyncio.sleep(0.3)
        runner.proc.send_signal(signal.SIGSTOP)
        try:
            failed = await _all_events(http, other.url, id)
        finally:
            runner.proc.send_signal(signal.SIGCONT)
        assert failed[-1]["type"] == "response.failed" and failed[-1]["response"]["status"] == "failed"
        await asyncio.wait_for(upstream.disconnected.wait(), 5)  # resumed, it found its lease gone and stopped
        await eventually(lambda: "this one's writes are refused" in runner.stderr(), 5)
        for url in (runner.url, other.url):
            assert await _all_events(http, url, id) == failed
            async with http.get(f"{url}/v1/responses/{id}") as response:
                kept = await response.json()
            assert kept["status"] == "failed" and kept["output"] == failed[-1]["response"]["output"]


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_a_killed_writer_lets_its_conversation_go_within_a_lease(upstream, spawn, tmp_path, redis_server, backend: str) -> None:
    """design.md 9.7: a response holds its conversation by a lease its process renews. SIGKILL
    the process mid-response: the conversation is refused (409) only until the lease runs out,
    then another replica writes to it."""
    store = {"url": f"sqlite:{tmp_path}/shared.db"} if backend == "sqlite" else {"url": redis_server.url, "prefix": f"held-{tmp_path.name}:"}
    config = {"upstreams": [{"name": "default", "urls": [upstream.url]}], "store": {**store, "conversation_lease": 1.5}}
    writer, other = await spawn(config), await spawn(config)
    upstream.script(Reply(SLOW, stall_after=4))
    async with fresh() as http:
        async with http.post(f"{writer.url}/v1/conversations", json={}) as made:
            conversation = (await made.json())["id"]
        turn = asyncio.create_task(http.post(f"{writer.url}/v1/responses", json={"model": "m", "input": "hi", "conversation": conversation, "stream": True}))
        await eventually(lambda: upstream.active_streams == 1)
        await asyncio.sleep(1.0)  # past a third of the lease: renewed at least once
        os.killpg(writer.proc.pid, signal.SIGKILL)
        killed = asyncio.get_running_loop().time()
        with contextlib.suppress(aiohttp.ClientError):
            (await turn).close()
        item = {"items": [{"type": "message", "role": "user", "content": "after"}]}

        async def writable() -> bool:
            async with http.post(f"{other.url}/v1/conversations/{conversation}/items", json=item) as added:
                assert added.status in (200, 409), await added.text()
                return added.status == 200

        assert not await writable()  # its lease, renewed, still runs
        await eventually(writable, 5)
        assert asyncio.get_running_loop().time() - killed < 1.5 + 0.5  # within a lease of its last renewal
