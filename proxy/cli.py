"""Command line: `responses-proxy` / `python -m proxy`. Worker processes start from this module
(not `__main__`), so that they can import their entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
from types import FrameType

from aiohttp import web

from . import __version__, logs, metrics
from . import config as config_module
from .appkeys import RUNTIME
from .config import Config, ConfigError
from .server import create_app, serve, shut_down

log = logging.getLogger("proxy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser() -> argparse.ArgumentParser:
    """The command line, whose help the documentation's reference page shows."""
    parser = argparse.ArgumentParser(
        prog="responses-proxy",
        description="OpenAI Responses API in front of SGLang, vLLM or any Chat Completions server.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", metavar="PATH", help="YAML config file (every key: configs/proxy.example.yaml)")
    parser.add_argument(
        "--check-config", metavar="PATH", help="validate PATH, print its routes, exit non-zero on error"
    )
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="one upstream for every model, replacing the config's upstreams and routes "
        f"(without a config: {config_module.DEFAULT_UPSTREAM})",
    )
    parser.add_argument("--host", help="address to listen on (default: the config's listen.host, 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (default: the config's listen.port, 8080)")
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="processes sharing the port with SO_REUSEPORT (default: 1)"
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: the config's log.level, info)",
    )
    return parser


def load_config(args: argparse.Namespace) -> Config:
    config = (
        config_module.load(args.config)
        if args.config
        else config_module.single_upstream(config_module.DEFAULT_UPSTREAM)
    )
    if args.upstream:
        upstreams = config_module.single_upstream(args.upstream).upstreams
        config = config_module.replace(config, upstreams=upstreams, routes=[])
    return config


async def run(args: argparse.Namespace, config: Config) -> None:
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    app = create_app(config)
    runner = await serve(app, host, port, connections=config.connections, reuse_port=args.workers > 1)
    log.info("listening on %s:%d", host, port)
    log_routes(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload, args, app)
    await stop.wait()
    await shut_down(app, runner, config.shutdown_grace)


def reload(args: argparse.Namespace, app: web.Application) -> None:
    """SIGHUP: take the new file whole, or keep the old config and say why."""
    try:
        config = load_config(args)
    except ConfigError as exc:
        log.error("config reload failed, keeping the running config: %s", exc)
        return
    app[RUNTIME].reload(config)
    log.info("config reloaded")
    log_routes(config)


def log_routes(config: Config) -> None:
    for line in config_module.describe(config).splitlines():
        log.info("route %s", line)


def serve_forever(args: argparse.Namespace, config: Config) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(args, config))
    else:
        uvloop.run(run(args, config))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check_config:
        try:
            config = config_module.load(args.check_config)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(config_module.describe(config))
        return 0
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log.format, args.log_level or config.log.level)
    if args.workers <= 1:
        serve_forever(args, config)
        return 0
    return _run_workers(args, config)


def _run_workers(args: argparse.Namespace, config: Config) -> int:
    """N processes on one port (SO_REUSEPORT); signals are passed on to every one. A worker
    that dies on its own takes the others down, so the orchestrator restarts a whole proxy
    rather than keep one running on fewer cores than it was given."""
    with tempfile.TemporaryDirectory(prefix="responses-proxy-metrics-") as shared:
        # Each worker's metrics go into files here, and any worker's /metrics adds them up.
        os.environ[metrics.SHARED] = shared
        return _supervise(args)


def _supervise(args: argparse.Namespace) -> int:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(args,), name=f"worker-{i}") for i in range(args.workers)]
    for worker in workers:
        worker.start()

    stopping = False

    def forward(sig: int, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = stopping or sig != signal.SIGHUP
        for worker in workers:
            if worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    multiprocessing.connection.wait([worker.sentinel for worker in workers])
    if not stopping:
        forward(signal.SIGTERM)
    for worker in workers:
        worker.join()
    return 0 if all(worker.exitcode == 0 for worker in workers) else 1


def _worker(args: argparse.Namespace) -> None:
    config = load_config(args)
    logs.setup(config.log.format, args.log_level or config.log.level)
    serve_forever(args, config)
