"""The Files API on the proxy's own store (design.md 8.16): a file uploaded (multipart,
`purpose: user_data`), listed, read, downloaded and deleted, owned by the API key like responses
and bounded per file and per key; an `input_file` part names it by its id."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any
from urllib.parse import quote

from aiohttp import BodyPartReader, web

from ..appkeys import OWNER, RUNTIME
from ..errors import InvalidRequest, NotFound, RequestTimeout, UnsupportedMediaType
from ..store import StoredFile
from .common import json_response, store_of

_PURPOSE = "user_data"  # what a request's input_file reads; the other purposes are OpenAI's tools'
_MAX_LIST = 10_000  # OpenAI's largest page


def _shown(file: StoredFile) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": file.created_at,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


async def upload(request: web.Request) -> web.Response:
    """POST /v1/files: `file` and `purpose` as multipart fields; past `files.max_bytes`, or past
    what the key may keep, a 400 naming `file`."""
    if request.content_type != "multipart/form-data":
        raise UnsupportedMediaType(f"Content-Type must be multipart/form-data, not {request.content_type}.")
    config = request.app[RUNTIME].config
    store = store_of(request)
    fields: dict[str, str] = {}
    content: bytes | None = None
    filename = ""
    try:
        async with asyncio.timeout(config.connections.body_timeout):  # a body trickled in holds a connection
            async for part in await request.multipart():
                if not isinstance(part, BodyPartReader) or part.name is None:
                    raise InvalidRequest("The form's parts are its fields, each named.")
                if part.name == "file":
                    filename = part.filename or "file"
                    content = await _read(part, config.files.max_bytes)
                else:
                    fields[part.name] = (await _read(part, 4096)).decode(errors="replace")
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {config.connections.body_timeout:g} s.") from None
    except ValueError as exc:  # a malformed form
        raise InvalidRequest(f"The form could not be read: {exc}.") from None
    if content is None:
        raise InvalidRequest("Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
    purpose = fields.get("purpose")
    if purpose != _PURPOSE:
        raise InvalidRequest(f"'purpose' is '{_PURPOSE}' here: files are read as a request's input.", param="purpose")
    now = time.time_ns()
    file = StoredFile(
        # Its time first: the files of one second are listed in the order they came.
        id=f"file-{now:016x}{os.urandom(8).hex()}",
        owner=request[OWNER],
        created_at=now // 1_000_000_000,
        filename=filename,
        bytes=len(content),
        purpose=purpose,
    )
    files = config.files
    passed = await store.put_file(file, content, files.max_files_per_key, files.max_bytes_per_key)
    if passed is not None:
        bound = (
            f"{files.max_files_per_key} files (files.max_files_per_key)"
            if passed == "files"
            else f"{files.max_bytes_per_key} bytes (files.max_bytes_per_key)"
        )
        raise InvalidRequest(f"This key keeps {bound} at most: delete one first.", param="file")
    return json_response(_shown(file))


async def _read(part: BodyPartReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk():
        data += chunk
        if len(data) > limit:
            raise InvalidRequest(f"The file is larger than the {limit} bytes this proxy keeps.", param=part.name)
    return bytes(data)


async def list_files(request: web.Request) -> web.Response:
    """GET /v1/files: the key's files, newest first (`order=asc`: oldest), from after the file
    `after`, `limit` of them, of one `purpose` if asked."""
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' is 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", _MAX_LIST))
    except ValueError:
        limit = 0
    if not 1 <= limit <= _MAX_LIST:
        raise InvalidRequest(f"'limit' is a number from 1 to {_MAX_LIST}.", param="limit")
    kept = await store_of(request).files(request[OWNER])
    purpose = query.get("purpose")
    ordered = sorted(
        (file for file in kept if purpose is None or file.purpose == purpose),
        key=lambda file: (file.created_at, file.id),
        reverse=order == "desc",
    )
    start = 0
    after = query.get("after")
    if after is not None:
        ids = [file.id for file in ordered]
        if after not in ids:
            raise InvalidRequest(f"No file with id '{after}'.", param="after")
        start = ids.index(after) + 1
    page = [_shown(file) for file in ordered[start : start + limit]]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + len(page) < len(ordered),
        }
    )


async def _found(request: web.Request) -> StoredFile:
    """The key's file; anyone else's is as unknown (design.md 9.5)."""
    id = request.match_info["id"]
    found = await store_of(request).file(id, request[OWNER])
    if found is None:
        raise NotFound(f"No file with id '{id}'.", param="file_id")
    return found


async def retrieve(request: web.Request) -> web.Response:
    return json_response(_shown(await _found(request)))


async def content(request: web.Request) -> web.Response:
    """GET /v1/files/{id}/content: the file's bytes, as uploaded."""
    file = await _found(request)
    data = await store_of(request).file_content(file.id, request[OWNER])
    if data is None:  # deleted meanwhile
        raise NotFound(f"No file with id '{file.id}'.", param="file_id")
    disposition = f"attachment; filename*=UTF-8''{quote(file.filename, safe='')}"
    return web.Response(
        body=data, content_type="application/octet-stream", headers={"Content-Disposition": disposition}
    )


async def delete(request: web.Request) -> web.Response:
    id = request.match_info["id"]
    if not await store_of(request).forget_file(id, request[OWNER]):
        raise NotFound(f"No file with id '{id}'.", param="file_id")
    return json_response({"id": id, "object": "file", "deleted": True})
