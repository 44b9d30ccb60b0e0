"""The harness the fault suites share (upstream faults, misbehaving clients, soak): a proxy
started in this process whose app can be inspected (`Running`; the `launch` and `baseline`
fixtures are in conftest), `settled` (the no-leak check), `healthy` (it still serves), and
small plain helpers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.appkeys import RUNTIME
from proxy.config import Config, Store, parse, replace
from proxy.server import create_app, serve
from proxy.upstream.client import UpstreamClient
from tests.client import LOGPROBS, eventually, stream, validate_response
from tests.events import Stream, check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score

BODY = {"model": "m", "input": "hi", "include": LOGPROBS, "top_logprobs": 2}


def free_port() -> int:
    """A loopback port nothing listens on (just now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss() -> int:
    """This process's resident set size, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def handler_errors(records: Iterable[logging.LogRecord]) -> list[logging.LogRecord]:
    """The ERROR records of aiohttp or the proxy: how a handler that raised shows."""
    return [r for r in records if r.levelno >= logging.ERROR and r.name.startswith(("aiohttp", "proxy"))]


# -- a proxy in this process ----------------------------------------------------------------------


@dataclass
class Running:
    """A proxy started in this process, with its app at hand."""

    url: str
    runner: web.AppRunner

    @classmethod
    async def start(cls, config: Config, **options: Any) -> Running:
        """Serve the proxy app (as `responses-proxy` runs it) for `config` on a loopback port;
        the default store is a SQLite file of its own, removed with the app."""
        store_dir = None
        if config.store == Store():
            store_dir = tempfile.mkdtemp(prefix="proxy-store-")
            config = replace(config, store=Store(url=f"sqlite:{store_dir}/responses.db"))
        app = create_app(config)
        if store_dir is not None:
            app.on_cleanup.append(lambda _: asyncio.to_thread(shutil.rmtree, store_dir, True))
        runner = await serve(app, "127.0.0.1", 0, connections=config.connections, **options)
        host, port = runner.addresses[0][:2]
        return cls(f"http://{host}:{port}", runner)

    @property
    def client(self) -> UpstreamClient:
        return self.runner.app[RUNTIME].clients["default"]

    @property
    def connector(self) -> aiohttp.BaseConnector:
        return self.client._session.connector

    def acquired(self) -> int:
        return len(self.connector._acquired)

    def pooled(self) -> list:
        return [proto for conns in self.connector._conns.values() for proto, _ in conns]


# -- a proxy in a process of its own ---------------------------------------------------------------

# The console script of the wheel as users install it, outside the checkout (`make smoke` and
# `.ci/run` set it): where it is set, the suites that start a proxy by its URL alone (`make e2e`)
# start that one. Unset, they serve the checkout's app in the test process.
INSTALLED = os.environ.get("RESPONSES_PROXY")
START_TIMEOUT = 20.0


@dataclass
class Spawned:
    """A proxy in a process of its own (and its own process group), on a loopback port, its
    config a file it can be sent again (SIGHUP), its output in a log in its working folder."""

    proc: asyncio.subprocess.Process
    url: str
    config: Path
    log: Path

    @classmethod
    async def start(cls, command: Sequence[str], config: Path, *args: str, cwd: Path, **options: Any) -> Spawned:
        """Run `command --config config --host 127.0.0.1 --port P *args` in `cwd` (where the
        default store's file goes) and wait until /health answers."""
        port = free_port()
        log = cwd / f"{config.stem}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port), *args,
                cwd=cwd, stdout=out, stderr=out, start_new_session=True, **options,
            )
        spawned = cls(proc, f"http://127.0.0.1:{port}", config, log)
        await eventually(spawned.healthy, START_TIMEOUT)
        return spawned

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def write(self, config: dict | str) -> None:
        self.config.write_text(config if isinstance(config, str) else yaml.safe_dump(config))

    async def healthy(self) -> bool:
        assert self.proc.returncode is None, f"the proxy exited {self.proc.returncode}:\n{self.stderr()}"
        try:
            async with aiohttp.ClientSession() as http, http.get(f"{self.url}/health") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    async def kill(self) -> None:
        """SIGKILL to its group: the process and any worker it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.returncode is None:
            await asyncio.wait_for(self.proc.wait(), 10)


def config_file(config: Config, path: Path) -> Path:
    """`config` as a file the proxy reads (JSON is YAML), every key as it is in force."""
    path.write_bytes(orjson.dumps(msgspec.to_builtins(config)))
    return path


def config(url: str, timeouts: dict | None = None, **top: Any) -> Config:
    upstream: dict[str, Any] = {"name": "default", "urls": [url]}
    if timeouts:
        upstream["timeouts"] = timeouts
    return parse({"upstreams": [upstream], **top})


def idle_server_tasks(*runners: web.AppRunner | None) -> set[asyncio.Task]:
    """Tasks of server connections that wait for their next request (keep-alive): not leaks."""
    tasks = set()
    for runner in runners:
        if runner is None or runner.server is None:
            continue
        for handler in runner.server.connections:
            if handler._task_handler is not None and handler._waiter is not None:
                tasks.add(handler._task_handler)
    return tasks


async def settled(running: Running, upstream: FakeUpstream | None, baseline: set[asyncio.Task], within: float = 3.0) -> None:
    """Poll (up to `within` s) until the proxy holds no upstream connection, every pooled one is
    alive, the fake streams nothing, and every task not in `baseline` is an idle keep-alive
    connection; fail with what is left otherwise."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        fake_runner = upstream._runner if upstream is not None else None
        background = running.runner.app[RUNTIME].background
        sweeper = set() if background is None else {background.sweeper}  # the app's own, for its lifetime
        extra = asyncio.all_tasks() - baseline - {asyncio.current_task()} - idle_server_tasks(running.runner, fake_runner) - sweeper
        broken = [proto for proto in running.pooled() if not proto.is_connected() or proto.should_close]
        streaming = upstream.active_streams if upstream is not None else 0
        if not (running.acquired() or broken or streaming or extra):
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(
                f"not settled: acquired={running.acquired()} broken={broken} active_streams={streaming} "
                f"tasks={[t.get_coro() for t in extra]}"
            )
        await asyncio.sleep(0.02)


# -- requests -------------------------------------------------------------------------------------


async def post(http: aiohttp.ClientSession, url: str, body: dict, seconds: float = 10.0) -> tuple[int, str, bytes]:
    """POST /v1/responses; (status, content type, raw body), within `seconds`."""

    async def go() -> tuple[int, str, bytes]:
        async with http.post(f"{url}/v1/responses", json=body) as response:
            return response.status, response.content_type, await response.read()

    return await asyncio.wait_for(go(), seconds)


async def checked_stream(http: aiohttp.ClientSession, url: str, body: dict, seconds: float = 10.0) -> Stream:
    """A streamed /v1/responses within `seconds`, its events held to the whole contract."""
    return check_stream(await asyncio.wait_for(stream(http, url, body), seconds))


async def healthy(http: aiohttp.ClientSession, running: Running, upstream: FakeUpstream, times: int = 2) -> None:
    """The proxy still serves, over whatever its pool kept, both modes."""
    gen = turn()
    for _ in range(times):
        upstream.script(Reply(gen), Reply(gen))
        run = await checked_stream(http, running.url, BODY)
        assert (run.terminal, run.text) == ("response.completed", "Hello world")
        status, _, raw = await post(http, running.url, BODY)
        assert status == 200, raw
        validate_response(orjson.loads(raw))


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple], float]:
    """The proxy's /metrics, by (sample name, sorted labels)."""
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


# -- generations ------------------------------------------------------------------------------------


def turn(dialect: str = "sglang", finish: str = "stop") -> Generation:
    return Generation(
        [
            Step("reasoning", "Let me", [score("Let"), score(" me")]),
            Step("reasoning", " think", [score(" think")]),
            Step("text", "Hello", [score("Hello")]),
            Step("scores", scores=[score(" wor")]),
            Step("text", " world", [score("ld")]),
            Step("finish", finish_reason=finish, scores=[score("<eos>")]),
        ],
        reasoning_tokens=3,
        dialect=dialect,
    )
