"""Fixtures: a fake upstream on loopback, the real proxy in front of it, real clients; and for
the fault suites, `launch` (a proxy whose app can be inspected) and `baseline` (for `settled`)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from proxy.config import Config, single_upstream
from tests.fake_upstream import FakeUpstream
from tests.harness import INSTALLED, Running, Spawned, config, config_file
from tests.mcp_servers import hostile_server, tool_server  # noqa: F401 (fixtures)
from tests.redis_server import Cluster, RedisServer, cluster_binary


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def start_proxy(tmp_path: Path) -> AsyncIterator[Callable[[Config], Awaitable[str]]]:
    """Start the proxy for a config, as `responses-proxy` runs it: the installed console script
    where `RESPONSES_PROXY` names one (tests/harness.py), else the checkout's app in this process;
    returns its URL."""
    runners: list[web.AppRunner] = []
    processes: list[Spawned] = []

    async def start(config: Config) -> str:
        if INSTALLED:
            path = config_file(config, tmp_path / f"proxy-{len(processes)}.yaml")
            processes.append(await Spawned.start([INSTALLED], path, cwd=tmp_path))
            return processes[-1].url
        running = await Running.start(config)
        runners.append(running.runner)
        return running.url

    yield start
    for runner in runners:
        await runner.cleanup()
    for process in processes:
        process.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.proc.wait(), 40) == 0, process.stderr()


@pytest.fixture
async def proxy(upstream: FakeUpstream, start_proxy) -> str:
    return await start_proxy(single_upstream(upstream.url))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def sdk(proxy: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The openai SDK, checking each answer against its own types (by default it builds them
    unchecked: a required field missing would pass)."""
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=10, _strict_response_validation=True)
    yield client
    await client.close()


@pytest.fixture
async def launch(upstream: FakeUpstream) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """`await launch(timeouts=..., url=..., **config)`: a proxy over the fake upstream (or `url`)."""
    runners: list[web.AppRunner] = []

    async def start(url: str | None = None, timeouts: dict | None = None, **top: Any) -> Running:
        running = await Running.start(config(url or upstream.url, timeouts, **top), linger=0.5)
        runners.append(running.runner)
        return running

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def baseline() -> set[asyncio.Task]:
    """The tasks alive before the test: what `settled` does not count as left behind."""
    return set(asyncio.all_tasks())


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session; each test keeps its keys under a prefix of its own."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One real Redis Cluster (three primaries, three replicas) for the session."""
    if cluster_binary() is None:
        pytest.skip("no redis-server 7 or later with redis-cli, to run a cluster: apt-get install redis-server")
    with Cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "redis", "cluster"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The config of a response store, once per backend: a SQLite file, the real Redis, a real
    Redis Cluster (design.md 9.9)."""
    if request.param == "sqlite":
        return {"url": f"sqlite:{tmp_path}/responses.db"}
    prefix = f"test-{uuid.uuid4().hex}:"
    if request.param == "cluster":
        return {"url": request.getfixturevalue("redis_cluster").url, "prefix": prefix}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"url": server.url, "prefix": prefix}
