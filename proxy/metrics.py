"""Prometheus metrics, one registry per app (tests run several apps in one process); with
`--workers N`, the sum over every worker process (prometheus_client's multiprocess mode: each
process writes its values to a file in a folder they share, and a scrape adds them up)."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, exposition, generate_latest, multiprocess

from . import __version__
from .errors import CLIENT_LEFT
from .tracing import error_type, failed_in

if TYPE_CHECKING:
    from .config import Target
    from .responses.translate import ResponseTranslator

# The text format's version that generate_latest writes (names escaped to the classic form), as
# prometheus_client's own handlers serve it: its CONTENT_TYPE_LATEST names 1.0.0 since 0.22,
# where it was 0.0.4 before.
CONTENT_TYPE: str = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)

# The folder worker processes share their values in; set by the parent before it starts them,
# since prometheus_client reads it when it is first imported.
SHARED = "PROMETHEUS_MULTIPROC_DIR"

# The GenAI semantic conventions' advised buckets: time to the first token, per output token,
# tokens a call, and a call's duration (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/).
_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
_PER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5)
_TOKEN_BUCKETS = tuple(4**power for power in range(14))
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# The labels the GenAI conventions require of their metrics, in this order.
_GEN_AI_LABELS = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]
# Distinct model names a route's GenAI metrics show, and their length: a glob route serves any
# name a client sends, so both are bounded; past them, the route's pattern (design.md 12.2).
MAX_MODELS_PER_ROUTE = 20
_MAX_MODEL_NAME = 128
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Distinct `what` labels of the ignored counter, and their length: clients choose unknown
# field names, so both are bounded; past them a name counts as `other`, and is not logged
# (design.md 8.1).
_MAX_IGNORED_KINDS = 256
_MAX_IGNORED_NAME = 128

M = TypeVar("M", Counter, Histogram)
T = TypeVar("T")
# A call's GenAI labels: operation, provider (the upstream's dialect), request model.
GenAI = tuple[str, str, str]


class Labelled(Generic[M]):
    """A labelled metric whose children are looked up in a dict: prometheus_client's own
    `labels()` checks and locks on every call, and every request calls it several times."""

    __slots__ = ("metric", "_children")

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[Any, ...], M] = {}

    def labels(self, *values: Any) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*(str(value) for value in values))
        return child


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Labelled(
            Counter(
                "proxy_requests",
                "Requests answered, by route, endpoint and HTTP status.",
                ["route", "endpoint", "status"],
                registry=self.registry,
            )
        )
        self.latency = Labelled(
            Histogram(
                "proxy_request_duration_seconds",
                "Time from request to the end of the answer.",
                ["endpoint"],
                buckets=_LATENCY_BUCKETS,
                registry=self.registry,
            )
        )
        self.first_token = Labelled(
            Histogram(
                "proxy_time_to_first_token_seconds",
                "Time from request to the first generated token sent.",
                ["route"],
                buckets=_LATENCY_BUCKETS,
                registry=self.registry,
            )
        )
        # The GenAI conventions' names beside the proxy's own, with the labels they require
        # (design.md 12.2); `gen_ai_request_model` bounded by `gen_ai()`.
        self.gen_ai_first_token = Labelled(
            Histogram(
                "gen_ai_server_time_to_first_token_seconds",
                "Time to generate the first token (gen_ai.server.time_to_first_token).",
                _GEN_AI_LABELS,
                buckets=_FIRST_TOKEN_BUCKETS,
                registry=self.registry,
            )
        )
        self.gen_ai_per_token = Labelled(
            Histogram(
                "gen_ai_server_time_per_output_token_seconds",
                "Time per output token after the first (gen_ai.server.time_per_output_token).",
                _GEN_AI_LABELS,
                buckets=_PER_TOKEN_BUCKETS,
                registry=self.registry,
            )
        )
        self.gen_ai_tokens = Labelled(
            Histogram(
                "gen_ai_client_token_usage",
                "Tokens a call to the inference server used, by type (gen_ai.client.token.usage).",
                [*_GEN_AI_LABELS, "gen_ai_token_type"],
                buckets=_TOKEN_BUCKETS,
                registry=self.registry,
            )
        )
        self.gen_ai_duration = Labelled(
            Histogram(
                "gen_ai_client_operation_duration_seconds",
                "Time of a call to the inference server, from its request to its answer's end; "
                "error_type set where it failed (gen_ai.client.operation.duration).",
                [*_GEN_AI_LABELS, "error_type"],
                buckets=_DURATION_BUCKETS,
                registry=self.registry,
            )
        )
        self._models: dict[str, set[str]] = {}  # by route pattern: the names its labels show
        self.streams = Gauge(
            "proxy_streams_in_flight",
            "Streaming responses being written.",
            registry=self.registry,
            multiprocess_mode="livesum",  # the live workers' streams together
        )
        # What runs, as Prometheus' build-info convention has it: 1, the facts in its labels.
        Gauge(
            "proxy_build_info",
            "The version of responses-proxy and the Python that runs it.",
            ["version", "python"],
            registry=self.registry,
            multiprocess_mode="max",
        ).labels(__version__, platform.python_version()).set(1)
        self.output_tokens = Labelled(
            Counter("proxy_output_tokens", "Tokens generated, from upstream usage.", ["route"], registry=self.registry)
        )
        self.prompt_tokens = Labelled(
            Counter("proxy_prompt_tokens", "Prompt tokens, from upstream usage.", ["upstream"], registry=self.registry)
        )
        self.cached_prompt_tokens = Labelled(
            Counter(
                "proxy_cached_prompt_tokens",
                "Prompt tokens the upstream found in its prefix cache, from its usage.",
                ["upstream"],
                registry=self.registry,
            )
        )
        self.affinity = Labelled(
            Counter(
                "proxy_session_routes",
                "Calls of a session on an upstream of several replicas, by how its replica was found: "
                "hit (the session's), prefix (a new session where its prompt's prefix was sent), new (a new session "
                "by load alone), spill (its replica was down or over its load bound).",
                ["upstream", "outcome"],
                registry=self.registry,
            )
        )
        self.upstream_errors = Labelled(
            Counter(
                "proxy_upstream_errors",
                "Upstream failures by upstream and kind.",
                ["upstream", "kind"],
                registry=self.registry,
            )
        )
        self._ignored = Labelled(
            Counter(
                "proxy_ignored",
                "What requests named that was not sent upstream: unknown fields, hosted tools, "
                "items with no chat form, unreadable sealed reasoning.",
                ["what"],
                registry=self.registry,
            )
        )
        self._ignored_kinds: set[str] = set()
        self.store_errors = Labelled(
            Counter(
                "proxy_store_errors",
                "Response store operations that failed, by operation.",
                ["operation"],
                registry=self.registry,
            )
        )

    def ignored(self, what: str) -> bool:
        """Count one thing a request named that was left out; True the first time it is seen."""
        known = what in self._ignored_kinds
        new = not known and len(what) <= _MAX_IGNORED_NAME and len(self._ignored_kinds) < _MAX_IGNORED_KINDS
        if new:
            self._ignored_kinds.add(what)
        self._ignored.labels(what if known or new else "other").inc()
        return new

    def gen_ai(self, target: Target) -> GenAI:
        """A call's GenAI labels (design.md 12.2), the one place its `gen_ai_request_model` is
        decided: the model name asked of the upstream, up to `MAX_MODELS_PER_ROUTE` distinct
        names a route (the first ones seen, kept for the process's life); past them, or a name
        over `_MAX_MODEL_NAME`, the route's pattern. Each process keeps its own (`--workers`)."""
        route, model = target.pattern, target.model
        names = self._models.get(route)
        if names is None:
            names = self._models[route] = set()
        if model not in names:
            if len(names) >= MAX_MODELS_PER_ROUTE or len(model) > _MAX_MODEL_NAME:
                model = route
            else:
                names.add(model)
        return "chat", target.upstream.dialect, model

    @contextlib.asynccontextmanager
    async def operation(
        self, call: AbstractAsyncContextManager[T], gen_ai: GenAI, answer: ResponseTranslator | None = None
    ) -> AsyncIterator[T]:
        """An upstream call timed, whole (design.md 12.2): its error's `error_type`, where it
        raised one or met one in its answer (`answer`: the translator the call feeds). A call
        cut short by its client's leaving (a cancel, or its answer left unread) is not the
        upstream's time, and is left out, as one its client left or steered (`CLIENT_LEFT`)."""
        started = time.monotonic()
        failed_before = answer.error if answer is not None else None
        try:
            async with call as exchange:
                yield exchange
        except CLIENT_LEFT:
            raise
        except Exception as error:
            self.gen_ai_duration.labels(*gen_ai, error_type(error)).observe(time.monotonic() - started)
            raise
        failed = failed_in(answer, failed_before)
        if failed is None and answer is not None and not answer.done:
            return
        kind = "" if failed is None else error_type(failed)
        self.gen_ai_duration.labels(*gen_ai, kind).observe(time.monotonic() - started)

    def first_chunk(self, route: str, gen_ai: GenAI, seconds: float) -> None:
        self.first_token.labels(route).observe(seconds)
        self.gen_ai_first_token.labels(*gen_ai).observe(seconds)

    def answered(
        self, route: str, upstream: str, gen_ai: GenAI, usage: dict[str, Any], first_chunk: float | None, seconds: float
    ) -> None:
        """A finished call's tokens (design.md 11.4) and, streamed, its time per output token."""
        made, read = usage["output_tokens"], usage["input_tokens"]
        self.output_tokens.labels(route).inc(made)
        self.prompt_tokens.labels(upstream).inc(read)
        self.cached_prompt_tokens.labels(upstream).inc(usage["input_tokens_details"]["cached_tokens"])
        self.gen_ai_tokens.labels(*gen_ai, "input").observe(read)
        self.gen_ai_tokens.labels(*gen_ai, "output").observe(made)
        if first_chunk is not None and made > 1:
            self.gen_ai_per_token.labels(*gen_ai).observe((seconds - first_chunk) / (made - 1))

    def upstream_error(self, upstream: str, kind: str) -> None:
        self.upstream_errors.labels(upstream, kind).inc()

    def session_route(self, upstream: str, outcome: str) -> None:
        self.affinity.labels(upstream, outcome).inc()

    def render(self) -> bytes:
        shared = os.environ.get(SHARED)
        if not shared:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        multiprocess.MultiProcessCollector(every_worker, path=shared)  # type: ignore[no-untyped-call]
        return generate_latest(every_worker)
