"""Fixtures: a fake upstream on loopback, the real proxy in front of it, real clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import openai
import pytest

from proxy.config import Config, single_upstream
from proxy.server import create_app, serve
from tests.fake_upstream import FakeUpstream


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
        runner = await serve(create_app(config), "127.0.0.1", 0)
        runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

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
