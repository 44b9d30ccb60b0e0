"""A real OTLP/HTTP trace receiver on loopback: what the proxy's exporter sends, decoded."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.harness import free_port


@dataclass
class ReceivedSpan:
    name: str
    kind: str  # SPAN_KIND_SERVER, ...
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status: str
    service: str


def _value(value: dict[str, Any]) -> Any:
    kind, found = next(iter(value.items()))
    if kind == "arrayValue":
        return [_value(entry) for entry in found.get("values", [])]
    return int(found) if kind == "intValue" else found


def _hex(encoded: str) -> str:
    """An id as `traceparent` writes it (the JSON form has it in base64)."""
    return base64.b64decode(encoded).hex()


class Collector:
    """POST /v1/traces: each export's spans, in order."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/v1/traces"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in MessageToDict(export).get("resourceSpans", []):
            service = {a["key"]: _value(a["value"]) for a in resource["resource"]["attributes"]}["service.name"]
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    self.spans.append(
                        ReceivedSpan(
                            name=span["name"],
                            kind=span.get("kind", ""),
                            trace_id=_hex(span["traceId"]),
                            span_id=_hex(span["spanId"]),
                            parent_span_id=_hex(span.get("parentSpanId", "")),
                            attributes={a["key"]: _value(a["value"]) for a in span.get("attributes", [])},
                            status=span.get("status", {}).get("code", ""),
                            service=service,
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def until(self, count: int, timeout: float = 10) -> list[ReceivedSpan]:
        async with asyncio.timeout(timeout):
            while len(self.spans) < count:
                await asyncio.sleep(0.02)
        return self.spans
