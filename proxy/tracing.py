"""OpenTelemetry traces in the GenAI semantic conventions (design.md 12): a server span for each
API request, a client span for each upstream call, its `traceparent` sent upstream so that
SGLang's and vLLM's own spans nest under it, and a span for each store operation.

Off unless configured, and then the SDK is imported; off, a request pays one None check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from . import config as config_module
from .errors import CLIENT_LEFT, ProxyError
from .responses.lifecycle import OWED

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .responses.translate import ResponseTranslator
    from .upstream.client import Exchange

E = TypeVar("E", bound="Exchange")
# The end of a response, as `gen_ai.response.finish_reasons` names it.
_FINISHES = {"max_output_tokens": "length", "content_filter": "content_filter"}


def error_type(error: BaseException) -> str:
    """`error.type` as the conventions have it (design.md 12.1), spans and metrics alike: the
    status an upstream answered with (the HTTP conventions' rule), else the proxy's own code
    (`upstream_timeout`, ...), else the exception's class; few values, for error rates to
    group by."""
    if isinstance(error, ProxyError):
        if error.upstream_status is not None:
            return str(error.upstream_status)
        if error.code:
            return error.code
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def failed_in(answer: ResponseTranslator | None, before: ProxyError | None) -> ProxyError | None:
    """The failure a call's answer met while it was read (a stream cut, an error frame): the
    translator's, where it was not there before the call (`before`). Such a call leaves its
    block as usual, the client getting `response.failed`, yet it failed (design.md 12.1)."""
    error = answer.error if answer is not None else None
    return error if error is not before else None


def enabled(settings: config_module.Tracing) -> bool:
    """`tracing.enabled`, else on where the standard OTLP endpoint variable is set; never with
    `OTEL_SDK_DISABLED=true`."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if settings.enabled is not None:
        return settings.enabled
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    def __init__(self, settings: config_module.Tracing, store_system: str | None) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and the sampler's variables apply as the SDK reads them.
        resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "responses-proxy")})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint)))
        self._tracer = self._provider.get_tracer("responses-proxy")
        self._propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self._kinds = trace.SpanKind
        self._store_system = store_system
        self.content = settings.content  # prompts and outputs in the spans: an explicit opt-in

    def server(
        self, method: str, route: str, path: str, scheme: str, headers: Mapping[str, str]
    ) -> Callable[[int], None]:
        """A request's span, continuing the caller's `traceparent`, made current; what ends it
        with the request's status."""
        from opentelemetry import context

        parent = self._propagator.extract(headers)
        # The HTTP server conventions require the method, the path and the scheme.
        attributes = {"http.request.method": method, "http.route": route, "url.path": path, "url.scheme": scheme}
        span = self._tracer.start_span(
            f"{method} {route}", context=parent, kind=self._kinds.SERVER, attributes=attributes
        )
        token = context.attach(self._trace.set_span_in_context(span, parent))

        def end(status: int) -> None:
            context.detach(token)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:  # a 4xx is the client's doing: no error of the server's (the HTTP conventions)
                self._failed(span, str(status))
            span.end()

        return end

    @contextlib.asynccontextmanager
    async def upstream(
        self,
        call: AbstractAsyncContextManager[E],
        headers: dict[str, str],
        upstream: config_module.Upstream,
        model: str,
        answer: ResponseTranslator | None = None,
    ) -> AsyncIterator[E]:
        """The upstream call as a client span, its `traceparent` in `headers` before they go;
        once it ends, what `answer` (the translator the call feeds, if any) read of it."""
        span = self._tracer.start_span(
            f"chat {model}",
            kind=self._kinds.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": upstream.dialect,
                "gen_ai.request.model": model,
                "proxy.upstream": upstream.name,
            },
        )
        self._propagator.inject(headers, context=self._trace.set_span_in_context(span))
        # What the translator held before: what the call adds is its own (a Response's later
        # rounds, 14.4, feed the same translator).
        rounds = len(answer.finish_reasons) if answer is not None else 0
        answered_before = answer.answer_id if answer is not None else None
        failed_before = answer.error if answer is not None else None
        try:
            async with call as exchange:
                url = exchange.response.url  # the replica that answered, of an upstream's several
                if url.host is not None and url.port is not None:
                    span.set_attributes({"server.address": url.host, "server.port": url.port})
                yield exchange
        except CLIENT_LEFT:  # as a cancel: no error of the call's
            raise
        except Exception as error:
            span.record_exception(error)
            self._failed(span, error_type(error), str(error))
            raise
        else:
            if answer is not None:
                span.set_attributes(_answer_attributes(answer, rounds, answered_before))
                failed = failed_in(answer, failed_before)
                if failed is not None:
                    self._failed(span, error_type(failed), failed.message)
        finally:
            span.end()

    def _failed(self, span: Span, kind: str, description: str | None = None) -> None:
        """An error, as the conventions record one: the span's status, and `error.type`, which
        error-rate searches group by (design.md 12.1)."""
        span.set_attribute("error.type", kind)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))

    @contextlib.contextmanager
    def store(self, operation: str) -> Iterator[None]:
        """A store operation's span (the database conventions)."""
        attributes = {"db.operation.name": operation, "db.system.name": self._store_system or "other"}
        with self._tracer.start_as_current_span(f"{operation} {self._store_system}", attributes=attributes):
            yield

    def turn(self, model: str, chat: dict[str, Any], stream: bool, session: str, provider: str) -> None:
        """What a Responses call asked, on its request's span (the current one), which it names
        (`chat {model}`); `provider`: the upstream's dialect, as its client spans name it."""
        span = self._trace.get_current_span()
        span.update_name(f"chat {model}")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,  # required of a GenAI span
            "openai.api.type": "responses",
            "gen_ai.request.model": model,
            "gen_ai.request.stream": stream,
            "gen_ai.conversation.id": session,
        }
        for attribute, key in (
            ("gen_ai.request.max_tokens", "max_completion_tokens"),
            ("gen_ai.request.temperature", "temperature"),
            ("gen_ai.request.top_p", "top_p"),
        ):
            if chat.get(key) is not None:
                attributes[attribute] = chat[key]
        if self.content:
            attributes["gen_ai.input.messages"] = orjson.dumps(chat["messages"]).decode()
        span.set_attributes(attributes)

    def answered(self, response: dict[str, Any], first_chunk: float | None) -> None:
        """What a Responses call made, on its request's span."""
        span = self._trace.get_current_span()
        output = response["output"]
        incomplete = response.get("incomplete_details") or {}
        finish = _FINISHES.get(incomplete.get("reason", ""), "stop")
        if any(item["type"] in OWED for item in output):  # ended for its client's tools
            finish = "tool_calls"
        failed = response["status"] == "failed"
        if failed:
            # A stream that failed once it began is a 200 (`response.failed` inside it): the
            # span says so itself, by the failed Response's error code.
            error = response.get("error") or {}
            self._failed(span, error.get("code") or "_OTHER", error.get("message"))
        attributes: dict[str, Any] = {
            "gen_ai.response.id": response["id"],
            "gen_ai.response.model": response["model"],
            "gen_ai.response.finish_reasons": ["error" if failed else finish],
            **_usage_attributes(response["usage"]),
        }
        if first_chunk is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = first_chunk
        if self.content:
            attributes["gen_ai.output.messages"] = orjson.dumps(output).decode()
        span.set_attributes(attributes)

    async def close(self) -> None:
        """Export what is left, the batch still held, from a thread: the exporter blocks."""
        await asyncio.to_thread(self._provider.shutdown)


def _answer_attributes(answer: ResponseTranslator, rounds: int, answered_before: str | None) -> dict[str, Any]:
    """What an upstream call answered, on its client span (design.md 12.1), from the translator
    it fed: the finish reasons it added; the completion's id and model where the call was the
    one that gave them (the translator keeps its first round's); the usage where the call was
    the Response's one round and ended it, whose usage is then the call's alone."""
    attributes: dict[str, Any] = {}
    if answered_before is None and answer.answer_id is not None:
        attributes["gen_ai.response.id"] = answer.answer_id
        if answer.answer_model:
            attributes["gen_ai.response.model"] = answer.answer_model
    finishes = answer.finish_reasons[rounds:]
    if finishes:
        attributes["gen_ai.response.finish_reasons"] = finishes
    response = answer.response
    if not rounds and response is not None and response["status"] != "failed":
        attributes |= _usage_attributes(response["usage"])
    return attributes


def _usage_attributes(usage: dict[str, Any]) -> dict[str, Any]:
    """A Response's usage, as the conventions' `gen_ai.usage.*`."""
    return {
        "gen_ai.usage.input_tokens": usage["input_tokens"],
        "gen_ai.usage.output_tokens": usage["output_tokens"],
        "gen_ai.usage.cache_read.input_tokens": usage["input_tokens_details"]["cached_tokens"],
        "gen_ai.usage.reasoning.output_tokens": usage["output_tokens_details"]["reasoning_tokens"],
    }
