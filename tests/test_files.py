"""Files (design.md 8.16) through the real proxy, the openai SDK as the client (its own types
checking every answer): the Files API on each store backend, `input_file` parts given by id, by
their bytes and by URL, read into the chat message (a real PDF's pages in order, marked; their
images for a route that reads images), over HTTP and the WebSocket, stored and chained; and every
limit and policy a 400 naming the part."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types import FileObject

from proxy.config import parse
from tests.client import LOGPROBS, envelope
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.pdfs import pdf
from tests.test_websocket import one_turn

REPORT = pdf([["Quarterly report", "Revenue (net) rose 12%."], ["Outlook: steady."], ["Appendix."]])
SCAN = pdf([None, None])
READ = Generation([Step("text", "Revenue rose.", [score("Revenue rose.")]), Step("finish", finish_reason="stop")])
KEYS = ["sk-a", "sk-b"]


def proxy_config(upstream: FakeUpstream, store: dict[str, Any], **files: Any) -> Any:
    return parse({"upstreams": [{"name": "u", "urls": [upstream.url]}], "store": store, "auth": {"api_keys": KEYS}, "files": files})


def client(url: str, key: str = "sk-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20, _strict_response_validation=True)


def asking(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "Summarise this."}, *parts]}]


def text_of(chat: dict[str, Any]) -> str:
    """What the upstream was sent of the last user message, as text."""
    content = chat["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


REPORT_READ = (
    "Summarise this.[file report.pdf: PDF, 3 pages]\n"
    "[page 1]\nQuarterly report\nRevenue (net) rose 12%.\n"
    "[page 2]\nOutlook: steady.\n"
    "[page 3]\nAppendix.\n"
    "[end of file report.pdf]\n"
)


async def test_the_sdk_uploads_a_file_that_a_request_reads_by_its_id(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> None:
    """On each backend: uploaded, listed, read, downloaded; read into the message a request
    sends, streamed and not; another key's files are as unknown; deleted, it is gone."""
    url = await start_proxy(proxy_config(upstream, store))
    upstream.script(Reply(READ))
    async with client(url) as sdk, client(url, "sk-b") as other:
        made = await sdk.files.create(file=("report.pdf", REPORT, "application/pdf"), purpose="user_data")
        assert (made.filename, made.bytes, made.purpose, made.status) == ("report.pdf", len(REPORT), "user_data", "processed")
        second = await sdk.files.create(file=("notes.txt", b"Call Ana at 10.\n", "text/plain"), purpose="user_data")
        assert [file.id async for file in sdk.files.list()] == [second.id, made.id]  # newest first
        assert (await sdk.files.retrieve(made.id)).model_dump() == made.model_dump()
        assert (await sdk.files.content(made.id)).content == REPORT

        answer = await sdk.responses.create(model="m", input=asking({"type": "input_file", "file_id": made.id}))  # type: ignore[arg-type]
        assert answer.output_text == "Revenue rose."
        assert text_of(upstream.requests[-1]) == REPORT_READ  # every page, in order, marked
        async with await sdk.responses.create(
            model="m", input=asking({"type": "input_file", "file_id": second.id}), stream=True  # type: ignore[arg-type]
        ) as events:
            kinds = [event.type async for event in events]
        assert kinds[-1] == "response.completed"
        assert text_of(upstream.requests[-1]) == "Summarise this.[file notes.txt]\nCall Ana at 10.\n\n[end of file notes.txt]\n"
        # A chained turn reads the file its history gives again.
        await sdk.responses.create(model="m", previous_response_id=answer.id, input="And the outlook?")
        assert REPORT_READ.removeprefix("Summarise this.") in str(upstream.requests[-1]["messages"][0]["content"])

        with pytest.raises(openai.NotFoundError):  # another key's file is as unknown (9.5)
            await other.files.retrieve(made.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await other.responses.create(model="m", input=asking({"type": "input_file", "file_id": made.id}))  # type: ignore[arg-type]
        assert refused.value.param == "input[0].content[1].file_id"
        assert [file.id async for file in other.files.list()] == []

        deleted = await sdk.files.delete(made.id)
        assert (deleted.id, deleted.deleted) == (made.id, True)
        with pytest.raises(openai.NotFoundError):
            await sdk.files.retrieve(made.id)
        assert [file.id async for file in sdk.files.list()] == [second.id]


async def test_the_files_a_key_keeps_are_bounded(upstream: FakeUpstream, start_proxy, store: dict[str, Any]) -> None:
    url = await start_proxy(proxy_config(upstream, store, max_bytes=2048, max_files_per_key=2, max_bytes_per_key=3000))
    async with client(url) as sdk, client(url, "sk-b") as other:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.files.create(file=("big.txt", b"x" * 2049, "text/plain"), purpose="user_data")
        assert refused.value.param == "file"
        first = await sdk.files.create(file=("a.txt", b"a" * 1500, "text/plain"), purpose="user_data")
        with pytest.raises(openai.BadRequestError) as refused:  # 1500 + 1501 bytes: past the key's 3000
            await sdk.files.create(file=("b.txt", b"b" * 1501, "text/plain"), purpose="user_data")
        assert refused.value.param == "file" and "max_bytes_per_key" in refused.value.message
        await sdk.files.create(file=("c.txt", b"c" * 10, "text/plain"), purpose="user_data")
        with pytest.raises(openai.BadRequestError) as refused:  # a third file: past the key's 2
            await sdk.files.create(file=("d.txt", b"d", "text/plain"), purpose="user_data")
        assert "max_files_per_key" in refused.value.message
        await other.files.create(file=("e.txt", b"e" * 1500, "text/plain"), purpose="user_data")  # each key its own
        await sdk.files.delete(first.id)
        await sdk.files.create(file=("d.txt", b"d", "text/plain"), purpose="user_data")  # room again
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.files.create(file=("f.txt", b"f", "text/plain"), purpose="fine-tune")
        assert refused.value.param == "purpose"


def _pixels(data_url: str) -> tuple[int, int, bytes]:
    """A PNG the proxy drew (8-bit RGB, unfiltered rows): its width, height and pixels."""
    png = base64.b64decode(data_url.removeprefix("data:image/png;base64,"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    at, idat = 8, b""
    while at < len(png):
        (length,), kind = struct.unpack(">I", png[at : at + 4]), png[at + 4 : at + 8]
        idat += png[at + 8 : at + 8 + length] if kind == b"IDAT" else b""
        at += 12 + length
    rows = zlib.decompress(idat)
    assert len(rows) == height * (1 + 3 * width)
    return width, height, rows


@pytest.mark.parametrize(("detail", "edge"), [("low", 512), (None, 1024), ("high", 2048)])
async def test_a_route_that_reads_images_gets_each_pages_image_after_its_text(
    upstream: FakeUpstream, start_proxy, tmp_path: Path, detail: str | None, edge: int
) -> None:
    url = await start_proxy(proxy_config(upstream, {"url": f"sqlite:{tmp_path}/r.db"}, image_upstreams=["u"]))
    upstream.script(Reply(READ))
    part: dict[str, Any] = {"type": "input_file", "filename": "scan.pdf", "file_data": base64.b64encode(SCAN).decode()}
    if detail:
        part["detail"] = detail
    async with client(url) as sdk:
        await sdk.responses.create(model="m", input=asking(part))  # type: ignore[arg-type]
    content = upstream.requests[-1]["messages"][-1]["content"]
    kinds = [entry["type"] for entry in content]
    assert kinds == ["text", "text", "text", "image_url", "text", "image_url", "text"]
    assert [entry["text"] for entry in content if entry["type"] == "text"][1:] == [
        "[file scan.pdf: PDF, 2 pages]\n", "[page 1]\n", "[page 2]\n", "[end of file scan.pdf]\n",
    ]
    for image in (entry["image_url"] for entry in content if entry["type"] == "image_url"):
        assert image["detail"] == (detail or "auto")
        width, height, rows = _pixels(image["url"])
        assert height == edge and abs(width - edge * 612 / 792) < 1  # the page's shape, its longest side the detail's
        assert min(rows) < 100  # the page's marks are drawn: it is no blank page


async def test_a_file_given_by_its_bytes_over_the_websocket_and_chained(upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    url = await start_proxy(proxy_config(upstream, {"url": f"sqlite:{tmp_path}/r.db"}))
    upstream.script(Reply(READ))
    part = {"type": "input_file", "filename": "report.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(REPORT).decode()}
    headers = {"Authorization": "Bearer sk-a"}
    async with http.ws_connect(f"{url}/v1/responses", headers=headers) as socket:
        first = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "input": asking(part), "include": LOGPROBS})
        assert first[-1]["type"] == "response.completed"
        assert text_of(upstream.requests[-1]) == REPORT_READ
        second = await one_turn(socket, {"type": "response.create", "model": "m", "store": False, "previous_response_id": first[-1]["response"]["id"], "input": "More?"})
        assert second[-1]["type"] == "response.completed"
    assert upstream.requests[-1]["messages"][0]["content"] == REPORT_READ


@pytest.mark.parametrize(
    ("settings", "part", "param", "says"),
    [
        pytest.param({}, {"type": "input_file", "filename": "s.pdf", "file_data": base64.b64encode(SCAN).decode()}, "input[0].content[1]", "no text", id="scan-on-a-text-route"),
        pytest.param({"max_pages": 2}, {"type": "input_file", "filename": "r.pdf", "file_data": base64.b64encode(REPORT).decode()}, "input[0].content[1]", "3 pages", id="past-max-pages"),
        pytest.param({"max_bytes": 1024}, {"type": "input_file", "filename": "r.pdf", "file_data": base64.b64encode(REPORT).decode()}, "input[0].content[1]", "max_bytes", id="past-max-bytes"),
        pytest.param({}, {"type": "input_file", "filename": "x.bin", "file_data": base64.b64encode(b"\x00\xff\x10binary").decode()}, "input[0].content[1]", "neither", id="not-pdf-nor-text"),
        pytest.param({}, {"type": "input_file", "filename": "x.pdf", "file_data": base64.b64encode(b"%PDF-1.4 broken").decode()}, "input[0].content[1]", "cannot be read", id="broken-pdf"),
        pytest.param({}, {"type": "input_file", "file_data": "not base64!"}, "input[0].content[1].file_data", "base64", id="not-base64"),
        pytest.param({}, {"type": "input_file", "file_id": "file-1", "file_url": "https://x.example/a.pdf"}, "input[0].content[1]", "exactly one", id="two-sources"),
        pytest.param({}, {"type": "input_file", "file_id": "file-unknown"}, "input[0].content[1].file_id", "No file", id="unknown-id"),
        pytest.param({}, {"type": "input_file", "file_url": "https://files.example/a.pdf"}, "input[0].content[1].file_url", "files.allowed_urls", id="url-not-allowed"),
    ],
)
async def test_a_file_that_cannot_be_given_to_the_route_is_a_400_naming_the_part(
    upstream: FakeUpstream, start_proxy, tmp_path: Path, http: aiohttp.ClientSession, settings: dict[str, Any], part: dict[str, Any], param: str, says: str
) -> None:
    url = await start_proxy(proxy_config(upstream, {"url": f"sqlite:{tmp_path}/r.db"}, **settings))
    body = {"model": "m", "input": asking(part)}
    async with http.post(f"{url}/v1/responses", json=body, headers={"Authorization": "Bearer sk-a"}) as answer:
        assert answer.status == 400
        error = envelope(await answer.json())
    assert error["param"] == param and says in error["message"], error
    assert upstream.requests == []  # never silently dropped: nothing went upstream


@pytest.fixture
async def file_server() -> AsyncIterator[str]:
    """A server on loopback with a PDF, a redirect to it, and a file past any limit."""
    app = web.Application()
    app.router.add_get("/docs/report.pdf", lambda _: web.Response(body=REPORT, content_type="application/pdf"))
    app.router.add_get("/docs/moved.pdf", lambda _: web.HTTPFound("/docs/report.pdf"))
    app.router.add_get("/docs/huge.txt", lambda _: web.Response(body=b"x" * 4096))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_a_file_url_is_fetched_under_the_operators_policy(
    upstream: FakeUpstream, start_proxy, tmp_path: Path, file_server: str, http: aiohttp.ClientSession
) -> None:
    """Admitted by an entry that names its host, it is fetched and read; a redirect is not
    followed; past the size limit, or behind a wildcard entry on a loopback address, a 400
    naming the part's `file_url` (design.md 8.16, 14.1)."""
    port = file_server.rpartition(":")[2]
    url = await start_proxy(
        proxy_config(
            upstream, {"url": f"sqlite:{tmp_path}/r.db"}, max_bytes=2048, allowed_urls=[f"{file_server}/docs/*", f"http://*:{port}/open/*"]
        )
    )
    upstream.script(Reply(READ))
    headers = {"Authorization": "Bearer sk-a"}

    async def ask(file_url: str) -> tuple[int, dict[str, Any]]:
        body = {"model": "m", "input": asking({"type": "input_file", "file_url": file_url})}
        async with http.post(f"{url}/v1/responses", json=body, headers=headers) as answer:
            return answer.status, await answer.json()

    status, _ = await ask(f"{file_server}/docs/report.pdf")
    assert status == 200 and text_of(upstream.requests[-1]) == REPORT_READ
    for file_url, says in (
        (f"{file_server}/docs/moved.pdf", "redirect"),
        (f"{file_server}/docs/huge.txt", "max_bytes"),
        # A wildcard entry admits public hosts alone: a name that resolves to loopback, or one written.
        (f"http://localhost:{port}/open/report.pdf", "internal address"),
        (f"http://127.0.0.1:{port}/open/report.pdf", "internal address"),
        (f"{file_server}/other/report.pdf", "files.allowed_urls"),
    ):
        status, body = await ask(file_url)
        assert status == 400, file_url
        error = envelope(body)
        assert error["param"] == "input[0].content[1].file_url" and says in error["message"], (file_url, error)
    assert len(upstream.requests) == 1


def test_the_sdks_file_object_is_what_the_api_answers() -> None:
    """The list's and retrieve's objects are the SDK's `FileObject` (checked by the strict client
    above); the type's required fields are the ones the proxy writes."""
    required = {name for name, field in FileObject.model_fields.items() if field.is_required()}
    assert required <= {"id", "object", "bytes", "created_at", "filename", "purpose", "status"}
