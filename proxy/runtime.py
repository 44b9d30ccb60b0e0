"""The config in force and what is built from it (upstream clients, the reasoning sealer, the
response store), swapped together on reload (the store takes a restart)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from . import config as config_module
from .background import BackgroundRuns
from .config import Config, Target, resolve, routed
from .errors import ServerShuttingDown
from .metrics import Metrics
from .responses.sealing import Sealer, derive_key
from .store import ResponseStore
from .store.backend import Backend
from .store.sqlite import SQLiteBackend
from .tracing import Tracing
from .tracing import enabled as tracing_enabled
from .upstream.affinity import AffinityMap, LocalAffinity
from .upstream.client import UpstreamClient
from .upstream.mcp import McpServers

log = logging.getLogger("proxy")


class Runtime:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.metrics = metrics
        self.draining = False
        self.config = config
        self.api_keys = config.auth.keys()
        # Set up once: a reload's tracing section takes a restart, as the store's does.
        self.tracing = Tracing(config.tracing, store_system(config.store)) if tracing_enabled(config.tracing) else None
        self.store = open_store(config.store, metrics, self.tracing)
        self.clients = self._clients(config, {})
        self.mcp = McpServers(config.mcp)  # design.md 14
        self._secret = config.reasoning.secret()
        self.sealer = self._new_sealer()
        self.background = None if self.store is None else BackgroundRuns(self.store, config.background)
        self._retiring: dict[UpstreamClient, asyncio.Task[None]] = {}

    def target(self, model: str) -> tuple[Target, UpstreamClient] | None:
        """Resolve against one config: a request keeps what it got even if a reload follows."""
        config, clients = self.config, self.clients
        target = resolve(config, model)
        return None if target is None else (target, clients[target.upstream.name])

    async def drain(self, grace: float) -> bool:
        """Wait until no upstream request is in flight, for `grace` seconds at most; whether
        they all ended."""
        clients = [*self.clients.values(), *self._retiring]
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*(client.idle() for client in clients))
        except TimeoutError:
            return False
        return True

    def end_exchanges(self) -> None:
        """Fail every upstream exchange still open: its stream ends with `response.failed`."""
        error = ServerShuttingDown("The proxy is shutting down; retry the request.")
        for client in [*self.clients.values(), *self._retiring]:
            client.end_exchanges(error)

    def ready(self) -> bool:
        """Not draining, and every route with a healthy replica: an upstream no route uses
        cannot take the process out of rotation."""
        return not self.draining and all(self.clients[route.upstream].ready() for route in routed(self.config))

    def reload(self, config: Config) -> None:
        """Take `config`; an upstream whose settings did not change keeps its client (and its
        pooled connections); a replaced client closes once its requests have finished."""
        old = self.clients
        self.clients = self._clients(config, old)
        self.config = config
        self.api_keys = config.auth.keys()
        if config.mcp != self.mcp.config:
            self.mcp = McpServers(config.mcp)
        if config.reasoning.secret() != self._secret:
            self._secret = config.reasoning.secret()
            self.sealer = self._new_sealer()
        kept = set(map(id, self.clients.values()))
        for client in old.values():
            if id(client) not in kept:
                task = asyncio.create_task(client.close_when_idle())
                self._retiring[client] = task
                task.add_done_callback(self._retired(client))

    async def close(self) -> None:
        for client, task in list(self._retiring.items()):
            task.cancel()
            await client.close()
        if self.background is not None:  # already stopped after a SIGTERM's drain: then at once
            await self.background.stop(linger=1.0)
        for client in self.clients.values():
            await client.close()
        if self.store is not None:
            await self.store.close()
        if self.tracing is not None:
            await self.tracing.close()

    def _new_sealer(self) -> Sealer:
        if self._secret:
            return Sealer(derive_key(self._secret))
        key = self.config.reasoning.key_env
        log.warning(
            "no reasoning key configured (reasoning.key, or $%s): this process seals reasoning with a key of its own, "
            "so encrypted reasoning replayed after a restart or to another replica is dropped",
            key,
        )
        return Sealer(os.urandom(32))

    def _retired(self, client: UpstreamClient) -> Callable[[object], None]:
        def forget(_: object) -> None:
            self._retiring.pop(client, None)

        return forget

    def _clients(self, config: Config, old: dict[str, UpstreamClient]) -> dict[str, UpstreamClient]:
        clients = {}
        for upstream in config.upstreams:
            previous = old.get(upstream.name)
            unchanged = previous is not None and previous.config == upstream
            if previous is not None and unchanged:
                clients[upstream.name] = previous
            else:
                affinity = self._affinity(upstream)
                metrics = self.metrics
                clients[upstream.name] = UpstreamClient(
                    upstream, metrics.upstream_error, affinity, metrics.session_route
                )
        return clients

    def _affinity(self, upstream: config_module.Upstream) -> AffinityMap:
        """Where sessions keep their replicas: in Redis when the store is (every gateway replica
        sees a spill), else in this process (design.md 11.3)."""
        backend = None if self.store is None else self.store.backend
        if backend is None or isinstance(backend, SQLiteBackend):
            return LocalAffinity(upstream.affinity_ttl)
        from .store.redis import RedisBackend  # only where a Redis store is configured (design.md 2.6)

        assert isinstance(backend, RedisBackend)
        return backend.affinity(upstream.name, upstream.affinity_ttl, upstream.session_window)


def store_system(settings: config_module.Store) -> str | None:
    if settings.url == "none":
        return None
    return "sqlite" if settings.sqlite_path is not None else "redis"


def open_store(settings: config_module.Store, metrics: Metrics, tracing: Tracing | None = None) -> ResponseStore | None:
    if settings.url == "none":
        return None
    path = settings.sqlite_path
    backend: Backend
    if path is not None:
        backend = SQLiteBackend(path, settings.ttl, settings.max_responses)
    else:
        from .store.redis import RedisBackend  # redis-py, only where configured (design.md 2.6)

        backend = RedisBackend(
            settings.url,
            settings.prefix,
            settings.ttl,
            settings.max_responses,
            settings.timeout,
            settings.max_connections,
            sentinel=settings.sentinels,
            cluster=settings.cluster,
        )
    count = metrics.store_errors
    return ResponseStore(
        backend,
        settings.timeout,
        lambda operation: count.labels(operation).inc(),
        tracing.store if tracing else None,
        settings.max_calls_per_key,
    )
