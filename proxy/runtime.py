"""The config in force and its upstream clients, swapped together on reload."""

from __future__ import annotations

import asyncio

from .config import Config, Route, resolve
from .metrics import Metrics
from .upstream.client import UpstreamClient


class Runtime:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.metrics = metrics
        self.draining = False
        self.config = config
        self.api_keys = config.auth.keys()
        self.clients = self._clients(config, {})
        self._retiring: dict[UpstreamClient, asyncio.Task] = {}

    def route(self, model: str) -> tuple[Route, UpstreamClient] | None:
        """Resolve against one config: a request keeps what it got even if a reload follows."""
        config, clients = self.config, self.clients
        route = resolve(config, model)
        return None if route is None else (route, clients[route.upstream.name])

    def ready(self) -> bool:
        return not self.draining and all(client.ready() for client in self.clients.values())

    def reload(self, config: Config) -> None:
        """Take `config`; an upstream whose settings did not change keeps its client (and its
        pooled connections); a replaced client closes once its requests have finished."""
        old = self.clients
        self.clients = self._clients(config, old)
        self.config = config
        self.api_keys = config.auth.keys()
        kept = set(map(id, self.clients.values()))
        for client in old.values():
            if id(client) not in kept:
                task = asyncio.create_task(client.close_when_idle())
                self._retiring[client] = task
                task.add_done_callback(lambda _, client=client: self._retiring.pop(client, None))

    async def close(self) -> None:
        for client, task in list(self._retiring.items()):
            task.cancel()
            await client.close()
        for client in self.clients.values():
            await client.close()

    def _clients(self, config: Config, old: dict[str, UpstreamClient]) -> dict[str, UpstreamClient]:
        clients = {}
        for upstream in config.upstreams:
            previous = old.get(upstream.name)
            same = previous is not None and previous.config == upstream
            clients[upstream.name] = previous if same else UpstreamClient(upstream, self.metrics.upstream_error)
        return clients
