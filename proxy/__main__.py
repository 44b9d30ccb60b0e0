"""Command line: `responses-proxy` / `python -m proxy`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from . import config as config_module
from .config import Config, ConfigError
from .server import create_app, serve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="responses-proxy",
        description="OpenAI Responses API in front of SGLang, vLLM or any Chat Completions server.",
    )
    parser.add_argument("--config", metavar="PATH", help="YAML config file (see configs/proxy.example.yaml)")
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help=f"one upstream for every model, replacing the config's upstreams and routes (default without a config: {config_module.DEFAULT_UPSTREAM})",
    )
    parser.add_argument("--host", help="address to listen on (default: the config's listen.host, 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (default: the config's listen.port, 8080)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (default: info)")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    config = config_module.load(args.config) if args.config else config_module.single_upstream(config_module.DEFAULT_UPSTREAM)
    if args.upstream:
        single = config_module.single_upstream(args.upstream)
        config = config_module.Config(upstreams=single.upstreams, listen=config.listen)
    return config


async def run(config: Config, host: str, port: int) -> None:
    runner = await serve(create_app(config), host, port)
    logging.getLogger("proxy").info("listening on %s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(config, host, port))
    else:
        uvloop.run(run(config, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
