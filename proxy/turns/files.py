"""A request's files read before its call is planned (design.md 8.16): each `input_file` part's
bytes, from the part itself, from the Files API's store, or from its URL (`upstream.files`); then
read into text and page images in a thread."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from ..config import Files, Target
from ..errors import InvalidRequest
from ..responses import files
from ..responses.schema import ContentPart, CustomToolCallOutput, FunctionCallOutput, InputFile, InputItem, Message
from ..runtime import Runtime
from ..upstream.files import fetched
from .history import History


async def read_files(runtime: Runtime, owner: str, past: History, own: int, target: Target) -> History:
    """The history with every file its items give read into what a chat message holds; `own`:
    how many of its items, the last, are the request's own input (a part of those is named by
    its place there, one of the history's by the field that brought it)."""
    request = past.request
    items = request.items()
    if not any(isinstance(part, InputFile) for item in items for part in _parts_of(item)):
        return past
    config = runtime.config.files
    reading = _Reading(runtime, owner, config, target.upstream.name in config.image_upstreams)
    first_own = len(items) - own
    history_field = "previous_response_id" if request.previous_response_id else "conversation"
    read: list[InputItem] = []
    for index, item in enumerate(items):
        where = f"input[{index - first_own}]" if index >= first_own else history_field
        read.append(await reading.item(item, where))
    return dataclasses.replace(past, request=msgspec.structs.replace(request, input=read))


def _parts_of(item: InputItem) -> list[ContentPart]:
    """The parts a file may be among: a message's content, a tool output's."""
    if isinstance(item, Message):
        return item.content if isinstance(item.content, list) else []
    if isinstance(item, FunctionCallOutput | CustomToolCallOutput):
        return item.output if isinstance(item.output, list) else []
    return []


class _Reading:
    def __init__(self, runtime: Runtime, owner: str, config: Files, images: bool) -> None:
        self._runtime, self._owner, self._config, self._images = runtime, owner, config, images
        self._limits = files.FileLimits(config.max_bytes, config.max_pages)

    async def item(self, item: InputItem, where: str) -> InputItem:
        parts = _parts_of(item)
        if not any(isinstance(part, InputFile) for part in parts):
            return item
        field = "content" if isinstance(item, Message) else "output"
        read: list[ContentPart] = []
        for index, part in enumerate(parts):
            if isinstance(part, InputFile):
                read += await self.part(part, f"{where}.{field}[{index}]" if where.startswith("input") else where)
            else:
                read.append(part)
        return msgspec.structs.replace(item, **{field: read})

    async def part(self, part: InputFile, where: str) -> list[files.FilePart]:
        kind = files.source(part, where)
        if kind == "file_data":
            data, name = files.file_data(part, where, self._limits), part.filename or "file"
        elif kind == "file_id":
            data, name = await self._kept(str(part.file_id), where)
        else:
            data, name = await fetched(str(part.file_url), self._config, f"{where}.file_url")
        return await asyncio.to_thread(files.read, data, name, part.detail, self._images, self._limits, where)

    async def _kept(self, id: str, where: str) -> tuple[bytes, str]:
        """A file the Files API keeps for this key; anyone else's is as unknown (design.md 9.5)."""
        store = self._runtime.store
        found = await store.file(id, self._owner) if store is not None else None
        content = await store.file_content(id, self._owner) if store is not None and found is not None else None
        if found is None or content is None:
            raise InvalidRequest(f"No file with id '{id}'.", param=f"{where}.file_id")
        return content, found.filename
