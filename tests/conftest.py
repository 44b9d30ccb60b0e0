"""Fixtures: a fake upstream on loopback, the real proxy in front of it, real clients; and for
the fault suites, `launch` (a proxy whose app can be inspected) and `baseline` (for `settled`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from proxy.config import Config, single_upstream
from tests.fake_upstream import FakeUpstream
from tests.harness import Running, config


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def start_proxy() -> AsyncIterator[Callable[[Config], Awaitable[str]]]:
    """Start the proxy app (as `responses-proxy` runs it) for a config; returns its URL."""
    runners = []

    async def start(config: Config) -> str:
        running = await Running.start(config)
        runners.append(running.runner)
        return running.url

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def proxy(upstream: FakeUpstream, start_proxy) -> str:
    return await start_proxy(single_upstream(upstream.url))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def sdk(proxy: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=10)
    yield client
    await client.close()


@pytest.fixture
async def launch(upstream: FakeUpstream) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """`await launch(timeouts=..., url=..., **config)`: a proxy over the fake upstream (or `url`)."""
    runners: list[web.AppRunner] = []

    async def start(url: str | None = None, timeouts: dict | None = None, **top: Any) -> Running:
        running = await Running.start(config(url or upstream.url, timeouts, **top), shutdown_grace=0.5)
        runners.append(running.runner)
        return running

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def baseline() -> set[asyncio.Task]:
    """The tasks alive before the test: what `settled` does not count as left behind."""
    return set(asyncio.all_tasks())
