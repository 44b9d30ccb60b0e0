"""A request's `file_url` fetched under the operator's policy (design.md 8.16): `files.allowed_urls`
read as `mcp.allowed_servers` is (14.1), no redirect followed, no internal address unless an
entry names its host outright, the answer bounded by `files.max_bytes`."""

from __future__ import annotations

import ipaddress
import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from ..config import Files
from ..errors import InvalidRequest
from ..responses.files import too_large
from .mcp import _internal, admitted


async def fetched(url: str, config: Files, param: str) -> tuple[bytes, str]:
    """The file's bytes and its name (its path's last segment); what cannot be fetched under the
    policy, or is past the size limit, a 400 naming `param`."""
    try:
        found = admitted(url, config.allowed_urls)
    except ValueError as exc:
        raise InvalidRequest(f"The file URL is not valid: {exc}", param=param) from None
    if found is None:
        raise InvalidRequest(
            f"The file URL '{url}' is not one this proxy's operator allows (files.allowed_urls).", param=param
        )
    sent, internal = found
    if not internal and _literal_internal(sent.host):
        raise _refused(sent.host, param)
    connector = aiohttp.TCPConnector(resolver=None if internal else _PublicOnly(), force_close=True)
    timeout = aiohttp.ClientTimeout(total=config.timeout)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.get(URL(str(sent), encoded=True), allow_redirects=False) as answer,
        ):
            if answer.status != 200:
                followed = ", a redirect, which is not followed" if 300 <= answer.status < 400 else ""
                raise InvalidRequest(f"The file URL answered {answer.status}{followed}.", param=param)
            data = bytearray()
            async for chunk in answer.content.iter_any():
                data += chunk
                if len(data) > config.max_bytes:
                    raise too_large(param, config.max_bytes)
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, _Internal):
            raise _refused(sent.host, param) from None
        raise InvalidRequest(f"The file URL could not be fetched: {exc}", param=param) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InvalidRequest(f"The file URL could not be fetched: {exc!r}", param=param) from None
    return bytes(data), sent.path.rstrip("/").rpartition("/")[2] or "file"


class _Internal(OSError):
    """A host that resolves to an address that is not public, where no entry names it."""


def _refused(host: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"The file URL's host {host} is an internal address the operator has not named (files.allowed_urls).",
        param=param,
    )


def _literal_internal(host: str) -> bool:
    """An address written in the URL, which a connection reaches without resolving it."""
    try:
        return _internal(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return False


class _PublicOnly(AbstractResolver):
    """A name resolved once, and refused unless every address it has is public: the addresses
    checked are those connected to, so that a second answer of its DNS cannot point elsewhere."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if not found or any(_internal(ipaddress.ip_address(entry["host"])) for entry in found):
            raise _Internal(f"{host} resolves to an internal address")
        return found

    async def close(self) -> None:
        await self._inner.close()
